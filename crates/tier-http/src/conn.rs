//! One client connection, once accepted: the plain HTTP/1.1 path (the hot
//! one, unchanged by the options below when they are off), and with a
//! [`Front`] the TLS handshake, ALPN's choice between HTTP/2 and HTTP/1.1,
//! and the HTTP/2 prior-knowledge preface on cleartext.
//!
//! Every connection has a watcher task ([`watch_for_close`]) that says when
//! to end it: the server stops, it waited the header-read timeout for a
//! request (the TLS handshake and the HTTP/2 preface count as that wait,
//! from the moment it was accepted), or the listener, full, displaces it.
//! HTTP/2 has no "waiting for a head" between requests of one stream, so
//! there the header-read timeout is the connection's idle timeout: it runs
//! while no stream is open. The body deadline applies per stream (on the
//! stream's [`RequestBody`]), the write timeout on the connection's socket.

use crate::guard::{ConnState, GuardedIo, RequestBody};
use crate::tls::{TlsServer, ALPN_H2};
use crate::{stopped, PeerAddr, ServeOptions};
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};

/// `--http2-max-concurrent-streams` unless told otherwise (nginx's default
/// is 128, hyper's 200; RFC 9113 advises no fewer than 100).
pub const HTTP2_MAX_CONCURRENT_STREAMS_DEFAULT: u32 = 100;
/// The largest request header list an HTTP/2 client may send (decoded).
pub const HTTP2_MAX_HEADER_LIST_BYTES_DEFAULT: u32 = 32 * 1024;
/// How much of one stream's request body a client may send unread.
pub const HTTP2_STREAM_WINDOW_BYTES_DEFAULT: u32 = 256 * 1024;
/// How much request body a client may send unread, over all its streams:
/// with the stream cap, what one connection can make the server buffer.
pub const HTTP2_CONNECTION_WINDOW_BYTES_DEFAULT: u32 = 1024 * 1024;
/// An idle HTTP/2 connection is pinged this often...
pub const HTTP2_KEEPALIVE_INTERVAL_DEFAULT: Duration = Duration::from_secs(20);
/// ...and closed if the ping is not answered within this.
pub const HTTP2_KEEPALIVE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(20);
/// A TLS handshake must be done this long after the connection was accepted.
pub const TLS_HANDSHAKE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// HTTP/2's limits (hyper's `h2` server enforces them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Http2Options {
    pub max_concurrent_streams: u32,
    pub max_header_list_bytes: u32,
    pub stream_window_bytes: u32,
    pub connection_window_bytes: u32,
    /// `None`: no pings (a dead peer is then found by the write timeout or
    /// the idle timeout only).
    pub keepalive_interval: Option<Duration>,
    pub keepalive_timeout: Duration,
}

impl Default for Http2Options {
    fn default() -> Self {
        Http2Options {
            max_concurrent_streams: HTTP2_MAX_CONCURRENT_STREAMS_DEFAULT,
            max_header_list_bytes: HTTP2_MAX_HEADER_LIST_BYTES_DEFAULT,
            stream_window_bytes: HTTP2_STREAM_WINDOW_BYTES_DEFAULT,
            connection_window_bytes: HTTP2_CONNECTION_WINDOW_BYTES_DEFAULT,
            keepalive_interval: Some(HTTP2_KEEPALIVE_INTERVAL_DEFAULT),
            keepalive_timeout: HTTP2_KEEPALIVE_TIMEOUT_DEFAULT,
        }
    }
}

/// What a listener speaks besides plain HTTP/1.1 ([`crate::serve_with_front`]).
#[derive(Clone, Default)]
pub struct Front {
    /// Terminate TLS; ALPN then picks HTTP/2 or HTTP/1.1.
    pub tls: Option<Arc<TlsServer>>,
    /// On cleartext, serve HTTP/2 to a client that opens with its preface
    /// (prior knowledge, RFC 9113 §3.3), HTTP/1.1 to any other. Costs a
    /// read of up to 24 bytes per connection before hyper sees it.
    pub http2_cleartext: bool,
    pub http2: Http2Options,
    /// `None`: [`TLS_HANDSHAKE_TIMEOUT_DEFAULT`].
    pub tls_handshake_timeout: Option<Duration>,
}

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Front")
            .field("tls", &self.tls.as_ref().map(|tls| tls.files()))
            .field("http2_cleartext", &self.http2_cleartext)
            .field("http2", &self.http2)
            .field("tls_handshake_timeout", &self.tls_handshake_timeout)
            .finish()
    }
}

impl Front {
    /// Plain HTTP/1.1 only: the connection takes the unchanged path.
    pub(crate) fn is_plain(&self) -> bool {
        self.tls.is_none() && !self.http2_cleartext
    }
}

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Why a connection's watcher ([`watch_for_close`]) ends it.
pub(crate) enum Close {
    /// The server stops: finish the request in progress, then close.
    Stop,
    /// No whole request head within the header-read timeout (HTTP/2: idle
    /// that long): close now.
    HeadTimeout,
    /// The listener is full and this connection stalled longest: close now.
    Evicted,
}

/// Everything a connection task needs besides its socket.
pub(crate) struct Conn<H> {
    pub(crate) handler: Arc<H>,
    pub(crate) state: Arc<ConnState>,
    pub(crate) peer: std::net::SocketAddr,
    pub(crate) options: ServeOptions,
    pub(crate) close: oneshot::Receiver<Close>,
    pub(crate) held: Held,
}

/// A new connection's place under the connection limit.
pub(crate) enum Slot {
    /// Held for its drop, which gives the slot back.
    #[allow(dead_code)]
    Held(tokio::sync::OwnedSemaphorePermit),
    /// A displaced connection is closing; its slot comes once it has.
    Freeing(Arc<tokio::sync::Semaphore>),
}

/// What a connection holds while it lives: its places under the limits,
/// the accept hook's guard, and its part in the listener's count of open
/// connections (the stop waits for every one to be dropped). Each is held
/// for its drop.
pub(crate) struct Held {
    pub(crate) _hook: Option<Box<dyn Send>>,
    pub(crate) slot: Option<Slot>,
    pub(crate) _client: Option<crate::guard::ClientSlot>,
    pub(crate) _registered: Option<crate::guard::Registered>,
    pub(crate) _open: tokio::sync::mpsc::Sender<()>,
}

impl Held {
    /// Waits for the connection's slot if a displaced one still holds it.
    async fn settled(mut self) -> Held {
        if let Some(Slot::Freeing(slots)) = &self.slot {
            let slots = slots.clone();
            self.slot = slots.acquire_owned().await.ok().map(Slot::Held);
        }
        self
    }
}

/// Serves one accepted connection with a [`Front`] (TLS, h2c): finds the
/// protocol, then serves it as [`serve_http1`] or [`serve_http2`].
pub(crate) async fn serve_front<H, F, B>(front: Arc<Front>, io: GuardedIo<TcpStream>, mut conn: Conn<H>)
where
    H: Fn(Request<RequestBody>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    conn.held = conn.held.settled().await;
    if let Some(tls) = &front.tls {
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
        let deadline = front.tls_handshake_timeout.unwrap_or(TLS_HANDSHAKE_TIMEOUT_DEFAULT);
        let handshake = tokio::time::timeout(deadline, acceptor.accept(io));
        let stream = tokio::select! {
            done = handshake => match done {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => return tracing::debug!(peer = %conn.peer, error = %e, "TLS handshake failed"),
                Err(_) => return tracing::debug!(peer = %conn.peer, "closing a connection whose TLS handshake took too long"),
            },
            // Stop, header timeout or eviction: a handshake is no request.
            _ = &mut conn.close => return,
        };
        let h2 = stream.get_ref().1.alpn_protocol() == Some(ALPN_H2);
        return if h2 { serve_http2(stream, conn, &front.http2).await } else { serve_http1(stream, conn).await };
    }
    // Cleartext with h2c: read as much of the preface as the client sends
    // first, and hand what was read back to the chosen protocol.
    let mut io = io;
    let mut first = [0u8; H2_PREFACE.len()];
    let mut read = 0;
    let h2 = loop {
        let reading = io.read(&mut first[read..]);
        let n = tokio::select! {
            n = reading => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = &mut conn.close => return,
        };
        read += n;
        if first[..read] != H2_PREFACE[..read] {
            break false;
        }
        if read == H2_PREFACE.len() {
            break true;
        }
    };
    let io = Prefixed { prefix: first, at: 0, len: read, inner: io };
    if h2 {
        serve_http2(io, conn, &front.http2).await
    } else {
        serve_http1(io, conn).await
    }
}

/// Serves HTTP/1.1 on `io` until the connection ends or its watcher ends it.
pub(crate) async fn serve_http1<IO, H, F, B>(io: IO, conn: Conn<H>)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<RequestBody>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Conn { handler, state, peer, options, close, held } = conn;
    let _held = held.settled().await;
    let on_request = state;
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
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        }
        // (A watcher gone without a word leaves the connection served.)
        Ok(close) = close => match close {
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
}

/// Serves HTTP/2 on `io` until the connection ends or its watcher ends it.
/// A request reaches the handler as an HTTP/1.1 one would: with a `Host`
/// field made from `:authority` when it has none (RFC 9113 §8.3.1), so
/// that forwarding and cache keys do not depend on the protocol.
pub(crate) async fn serve_http2<IO, H, F, B>(io: IO, conn: Conn<H>, limits: &Http2Options)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<RequestBody>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Conn { handler, state, peer, options, close, held } = conn;
    let _held = held.settled().await;
    let streams = state.clone();
    let service = service_fn(move |request: Request<Incoming>| {
        // Held until the stream's answer is done with, or its handler
        // dropped (a reset stream): while any is, the connection is busy.
        let open = StreamOpen::new(streams.clone());
        let deadline = options
            .body_read_timeout
            .filter(|_| !hyper::body::Body::is_end_stream(request.body()))
            .map(|timeout| tokio::time::Instant::now() + timeout);
        let mut request = request.map(|body| RequestBody::with_deadline(body, deadline));
        if !request.headers().contains_key(hyper::header::HOST) {
            let host = request.uri().authority().and_then(|a| hyper::header::HeaderValue::from_str(a.as_str()).ok());
            if let Some(host) = host {
                request.headers_mut().insert(hyper::header::HOST, host);
            }
        }
        if options.peer_addr {
            request.extensions_mut().insert(PeerAddr(peer));
        }
        let response = handler(request);
        async move {
            let response = response.await.map(|body| AnswerBody { body, waiting: Some(open) });
            Ok::<_, Infallible>(response)
        }
    });
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(limits.max_header_list_bytes)
        .initial_stream_window_size(limits.stream_window_bytes)
        .initial_connection_window_size(limits.connection_window_bytes)
        .keep_alive_interval(limits.keepalive_interval)
        .keep_alive_timeout(limits.keepalive_timeout);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "HTTP/2 connection ended with an error");
            }
        }
        Ok(close) = close => match close {
            // GOAWAY: streams open finish, no new ones. With none open,
            // close at once: the GOAWAY's ping would wait on a client
            // that may not answer (an idle HTTP/1.1 connection is closed
            // alike).
            Close::Stop if state.streams_open() > 0 => {
                connection.as_mut().graceful_shutdown();
                let _ = connection.await;
            }
            Close::Stop => tracing::debug!("closing an idle HTTP/2 connection: the server stops"),
            Close::HeadTimeout => tracing::debug!("closing an HTTP/2 connection idle past the header-read timeout"),
            Close::Evicted => tracing::debug!("closing the longest-stalled connection to make room for a new one"),
        },
    }
}

/// An open HTTP/2 stream, counted on its connection until dropped.
pub(crate) struct StreamOpen(Arc<ConnState>);

impl StreamOpen {
    fn new(state: Arc<ConnState>) -> Self {
        state.stream_opened();
        StreamOpen(state)
    }
}

impl Drop for StreamOpen {
    fn drop(&mut self) {
        self.0.stream_closed();
    }
}

/// What an [`AnswerBody`] tells its connection once done with.
pub(crate) trait Answered {
    fn answered(self);
}

impl Answered for Arc<ConnState> {
    /// HTTP/1.1: the connection waits for its next head.
    fn answered(self) {
        ConnState::answered(&self);
    }
}

impl Answered for StreamOpen {
    /// HTTP/2: the stream is closed (the drop counts it).
    fn answered(self) {}
}

/// A response body that, once done with, tells its connection.
pub(crate) struct AnswerBody<B, W: Answered> {
    body: B,
    waiting: Option<W>,
}

impl<B, W: Answered> AnswerBody<B, W> {
    fn done(&mut self) {
        if let Some(waiting) = self.waiting.take() {
            waiting.answered();
        }
    }
}

impl<B, W: Answered> Drop for AnswerBody<B, W> {
    fn drop(&mut self) {
        self.done();
    }
}

impl<B: hyper::body::Body + Unpin, W: Answered + Unpin> hyper::body::Body for AnswerBody<B, W> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
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

/// A stream whose first bytes were read already (to look for the HTTP/2
/// preface): they are read again first.
struct Prefixed<S> {
    prefix: [u8; H2_PREFACE.len()],
    at: usize,
    len: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.at < self.len {
            let n = (self.len - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.prefix[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Returns once the connection has waited `timeout` for a request head
/// (never without a timeout). Sleeps until the earliest moment that could
/// be, and looks again: one timer per connection re-armed when it fires,
/// not a timer per request (hyper's own costs an allocation, a timer-wheel
/// entry and a second read of every head).
async fn head_read_timeout(waiting: &ConnState, timeout: Option<Duration>) {
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

/// Tells its connection (through `close`) when the server stops, the
/// connection has waited the header-read timeout for a head, or the
/// registry displaces it; ends without a word once the connection has ended.
pub(crate) async fn watch_for_close(
    mut close: oneshot::Sender<Close>,
    stop: watch::Receiver<bool>,
    state: Arc<ConnState>,
    timeout: Option<Duration>,
) {
    let why = tokio::select! {
        _ = stopped(stop) => Close::Stop,
        _ = head_read_timeout(&state, timeout) => Close::HeadTimeout,
        _ = state.evict.notified() => Close::Evicted,
        _ = close.closed() => return,
    };
    let _ = close.send(why);
}
