//! Connections to the application servers: per upstream, a pool of idle
//! HTTP/1.1 connections over hyper's connection API, or (`--upstream-http2`,
//! h2c with prior knowledge) one shared HTTP/2 connection that carries
//! every request as a stream. The HTTP/2 path is boxed away from the
//! HTTP/1.1 one, so that a forward over HTTP/1.1 moves no larger futures.
//!
//! Why not hyper-util's pooled `Client`: a forward through it cost about
//! 9,000 instructions more per miss (callgrind, docs/results.md issue 10): a
//! SipHash'd pool key, a checkout raced against a connect, boxed futures,
//! the URI rewritten to origin-form and the authority cloned twice. Here
//! the upstream is an index, a checkout is a lock and a pop, and the target
//! is sent in origin-form as built.
//!
//! A connection goes back to its pool when the response body handed out
//! with it is dropped (read to its end, or abandoned: hyper then closes the
//! connection, and a closed one is never reused). Taken from the pool, it
//! is awaited until ready; a request the connection could not even start
//! (it closed while idle) is sent again on another one, so a server's idle
//! timeout never fails a request.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper::client::conn::http2;
use hyper::header::{HeaderValue, HOST};
use hyper::{Request, Response, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

type Sender = SendRequest<Full<Bytes>>;
type SharedSender = http2::SendRequest<Full<Bytes>>;

/// Why a request got no response head.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    /// No connection could be made: the request was not sent.
    #[error("connect error: {0}")]
    Connect(std::io::Error),
    #[error("{0}")]
    Http(hyper::Error),
}

impl UpstreamError {
    pub(crate) fn is_connect(&self) -> bool {
        matches!(self, UpstreamError::Connect(_))
    }

    /// The exchange failed on the connection's side before a response head
    /// (closed early, reset, unreadable head): nginx's `proxy_next_upstream
    /// error`. Not a misuse of the client by this proxy.
    pub(crate) fn is_failure_before_head(&self) -> bool {
        match self {
            UpstreamError::Connect(_) => true,
            UpstreamError::Http(e) => !e.is_user(),
        }
    }
}

/// One upstream's address and idle connections.
struct Pool {
    /// `host:port`, to connect to.
    address: String,
    /// The upstream's authority: the `Host` of a request without one.
    host: Option<HeaderValue>,
    idle: Mutex<Vec<Sender>>,
    idle_max: usize,
    /// HTTP/2 with prior knowledge: the one connection every request
    /// shares (`Some` once made), instead of `idle`.
    shared: Option<Mutex<Option<SharedSender>>>,
}

impl Pool {
    fn take(&self) -> Option<Sender> {
        let mut idle = self.idle.lock().ok()?;
        while let Some(sender) = idle.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    fn give_back(&self, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < self.idle_max {
                idle.push(sender);
            }
        }
    }

    async fn connect(&self) -> Result<Sender, UpstreamError> {
        let stream = tokio::net::TcpStream::connect(self.address.as_str()).await.map_err(UpstreamError::Connect)?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(UpstreamError::Http)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }

    /// The shared HTTP/2 connection if it is open, and whether it was
    /// (a new one is made and shared otherwise).
    async fn shared_sender(&self, shared: &Mutex<Option<SharedSender>>) -> Result<(SharedSender, bool), UpstreamError> {
        if let Ok(held) = shared.lock() {
            if let Some(sender) = held.as_ref().filter(|s| !s.is_closed()) {
                return Ok((sender.clone(), true));
            }
        }
        let stream = tokio::net::TcpStream::connect(self.address.as_str()).await.map_err(UpstreamError::Connect)?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(UPSTREAM_HTTP2_KEEPALIVE)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(UpstreamError::Http)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream HTTP/2 connection ended with an error");
            }
        });
        if let Ok(mut held) = shared.lock() {
            *held = Some(sender.clone());
        }
        Ok((sender, false))
    }

    /// [`Upstreams::request`] over the shared HTTP/2 connection.
    async fn request_http2(
        &self,
        shared: &Mutex<Option<SharedSender>>,
        mut request: Request<Full<Bytes>>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        as_http2(&mut request);
        loop {
            let (mut sender, reused) = self.shared_sender(shared).await?;
            if let Err(e) = sender.ready().await {
                if reused {
                    // Closed meanwhile: the next turn makes a new one.
                    if let Ok(mut held) = shared.lock() {
                        held.take();
                    }
                    continue;
                }
                return Err(UpstreamError::Http(e));
            }
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(response.map(|body| PooledBody { body, back: None })),
                Err(mut e) => match e.take_message() {
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(UpstreamError::Http(e.into_error())),
                },
            }
        }
    }
}

/// How often an idle upstream HTTP/2 connection is pinged (a dead one is
/// then found before a request waits on it).
const UPSTREAM_HTTP2_KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(20);

/// An origin-form request made fit for HTTP/2: its `Host` becomes the
/// URI's authority (`:authority`, RFC 9113 §8.3.1), with scheme `http`.
fn as_http2(request: &mut Request<Full<Bytes>>) {
    let Some(host) = request.headers_mut().remove(HOST) else { return };
    let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
    match host.to_str().ok().and_then(|host| format!("http://{host}{target}").parse::<Uri>().ok()) {
        Some(uri) => *request.uri_mut() = uri,
        // Not an authority: leave it a field (hyper sends it as one).
        None => {
            request.headers_mut().insert(HOST, host);
        }
    }
}

/// The upstreams' connection pools, by the index of the upstream.
pub(crate) struct Upstreams {
    pools: Vec<Arc<Pool>>,
}

impl Upstreams {
    /// Pools for `upstreams` (absolute `http` URIs with an authority),
    /// keeping at most `idle_max` idle connections each; `http2`: one shared
    /// HTTP/2 connection each instead (h2c, prior knowledge).
    pub(crate) fn new(upstreams: &[Uri], idle_max: usize, http2: bool) -> Upstreams {
        let pools = upstreams
            .iter()
            .map(|uri| {
                let authority = uri.authority();
                let host = authority.map_or("", |a| a.host());
                let port = uri.port_u16().unwrap_or(80);
                Arc::new(Pool {
                    address: format!("{host}:{port}"),
                    host: authority.and_then(|a| HeaderValue::from_str(a.as_str()).ok()),
                    idle: Mutex::new(Vec::new()),
                    idle_max,
                    shared: http2.then(|| Mutex::new(None)),
                })
            })
            .collect();
        Upstreams { pools }
    }

    /// Sends `request` (its URI in origin-form) to upstream `index` and
    /// waits for the response head. The body returns the connection to the
    /// pool once dropped.
    pub(crate) async fn request(
        &self,
        index: usize,
        mut request: Request<Full<Bytes>>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        let Some(pool) = self.pools.get(index) else {
            return Err(UpstreamError::Connect(std::io::Error::other(format!("no upstream {index}"))));
        };
        if !request.headers().contains_key(HOST) {
            if let Some(host) = &pool.host {
                request.headers_mut().insert(HOST, host.clone());
            }
        }
        if let Some(shared) = &pool.shared {
            // Boxed: the HTTP/1.1 path's future stays as small as it was.
            return Box::pin(pool.request_http2(shared, request)).await;
        }
        loop {
            let (mut sender, reused) = match pool.take() {
                Some(sender) => (sender, true),
                None => (pool.connect().await?, false),
            };
            if let Err(e) = sender.ready().await {
                if reused {
                    continue;
                }
                return Err(UpstreamError::Http(e));
            }
            match sender.try_send_request(request).await {
                Ok(response) => {
                    let back = Some((pool.clone(), sender));
                    return Ok(response.map(|body| PooledBody { body, back }));
                }
                Err(mut e) => match e.take_message() {
                    // Not started on a connection that closed while idle:
                    // another one.
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(UpstreamError::Http(e.into_error())),
                },
            }
        }
    }
}

/// An upstream response's body; gives its connection back when dropped.
pub(crate) struct PooledBody {
    body: Incoming,
    back: Option<(Arc<Pool>, Sender)>,
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        if let Some((pool, sender)) = self.back.take() {
            pool.give_back(sender);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// What the test server does after answering a request.
    #[derive(Clone, Copy, PartialEq)]
    enum Then {
        KeepOpen,
        /// Close the connection when the test says (as an idle timeout
        /// would), without announcing it.
        CloseWhenTold,
    }

    struct Server {
        address: std::net::SocketAddr,
        connections: Arc<AtomicUsize>,
        /// Each request head received, in order.
        heads: Arc<Mutex<Vec<String>>>,
        close: Arc<tokio::sync::Notify>,
    }

    /// An HTTP/1.1 server answering each request with `body`.
    async fn server(body: &'static [u8], then: Then) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let close = Arc::new(tokio::sync::Notify::new());
        let (counted, seen, told) = (connections.clone(), heads.clone(), close.clone());
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                counted.fetch_add(1, Ordering::SeqCst);
                stream.set_nodelay(true).unwrap();
                let (seen, told) = (seen.clone(), told.clone());
                tokio::spawn(async move {
                    loop {
                        let Some(head) = read_head(&mut stream).await else { return };
                        seen.lock().unwrap().push(head);
                        let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                        if stream.write_all(answer.as_bytes()).await.is_err() || stream.write_all(body).await.is_err() {
                            return;
                        }
                        if then == Then::CloseWhenTold {
                            told.notified().await;
                            return;
                        }
                    }
                });
            }
        });
        Server { address, connections, heads, close }
    }

    async fn read_head(stream: &mut TcpStream) -> Option<String> {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).await.ok()? == 0 {
                return None;
            }
            head.push(byte[0]);
        }
        Some(String::from_utf8_lossy(&head).into_owned())
    }

    fn upstreams(server: &Server, idle_max: usize) -> Upstreams {
        let uri: Uri = format!("http://{}", server.address).parse().unwrap();
        Upstreams::new(&[uri], idle_max, false)
    }

    fn get(target: &str) -> Request<Full<Bytes>> {
        Request::get(target).body(Full::new(Bytes::new())).unwrap()
    }

    async fn body_of(response: Response<PooledBody>) -> Bytes {
        response.into_body().collect().await.unwrap().to_bytes()
    }

    /// Waits (bounded, by yielding) until hyper sees the pool's one idle
    /// connection closed.
    async fn until_idle_closed(upstreams: &Upstreams) {
        for _ in 0..100_000 {
            if upstreams.pools[0].idle.lock().unwrap().iter().any(|s| s.is_closed()) {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the idle connection was never seen closed");
    }

    #[tokio::test]
    async fn sequential_requests_reuse_one_connection() {
        let server = server(b"hello", Then::KeepOpen).await;
        let upstreams = upstreams(&server, 8);
        for _ in 0..5 {
            let response = upstreams.request(0, get("/a")).await.unwrap();
            assert_eq!(body_of(response).await, "hello");
        }
        assert_eq!(server.connections.load(Ordering::SeqCst), 1);
        assert_eq!(server.heads.lock().unwrap().len(), 5);
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_replaced_and_the_request_not_failed() {
        let server = server(b"hello", Then::CloseWhenTold).await;
        let upstreams = upstreams(&server, 8);
        let response = upstreams.request(0, get("/a")).await.unwrap();
        assert_eq!(body_of(response).await, "hello");
        assert_eq!(upstreams.pools[0].idle.lock().unwrap().len(), 1, "the connection went back to the pool");
        server.close.notify_one();
        until_idle_closed(&upstreams).await;
        let response = upstreams.request(0, get("/b")).await.unwrap();
        assert_eq!(body_of(response).await, "hello");
        assert_eq!(server.connections.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_abandoned_body_does_not_leave_its_connection_to_the_next_request() {
        static LONG: [u8; 4 << 20] = [b'x'; 4 << 20];
        let server = server(&LONG, Then::KeepOpen).await;
        let upstreams = upstreams(&server, 8);
        let mut body = upstreams.request(0, get("/long")).await.unwrap().into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert!(first.len() < LONG.len(), "the test needs a body in several frames");
        drop(body);
        let response = upstreams.request(0, get("/again")).await.unwrap();
        assert_eq!(body_of(response).await.len(), LONG.len());
        assert_eq!(server.connections.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn concurrent_requests_get_connections_of_their_own_and_at_most_idle_max_stay() {
        let server = server(b"hello", Then::KeepOpen).await;
        let upstreams = Arc::new(upstreams(&server, 2));
        // Five responses held at once: five connections.
        let mut held = Vec::new();
        for _ in 0..5 {
            held.push(upstreams.request(0, get("/a")).await.unwrap());
        }
        assert_eq!(server.connections.load(Ordering::SeqCst), 5);
        for response in held {
            assert_eq!(body_of(response).await, "hello");
        }
        assert_eq!(upstreams.pools[0].idle.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_request_without_host_gets_the_upstream_s_and_one_with_keeps_its_own() {
        let server = server(b"hello", Then::KeepOpen).await;
        let upstreams = upstreams(&server, 8);
        body_of(upstreams.request(0, get("/a")).await.unwrap()).await;
        let mut own = get("/b");
        own.headers_mut().insert(HOST, HeaderValue::from_static("site.example"));
        body_of(upstreams.request(0, own).await.unwrap()).await;
        let heads = server.heads.lock().unwrap().clone();
        assert!(heads[0].starts_with("GET /a HTTP/1.1\r\n"), "{heads:?}");
        assert!(heads[0].to_ascii_lowercase().contains(&format!("host: {}\r\n", server.address)), "{heads:?}");
        assert!(heads[1].to_ascii_lowercase().contains("host: site.example\r\n"), "{heads:?}");
        assert_eq!(heads[1].to_ascii_lowercase().matches("host:").count(), 1, "{heads:?}");
    }

    #[tokio::test]
    async fn an_upstream_that_refuses_connections_is_a_connect_error() {
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Uri = format!("http://{}", closed.local_addr().unwrap()).parse().unwrap();
        drop(closed);
        let upstreams = Upstreams::new(&[uri], 8, false);
        let Err(error) = upstreams.request(0, get("/a")).await else { panic!("answered") };
        assert!(error.is_connect(), "{error}");
        let Err(error) = upstreams.request(7, get("/a")).await else { panic!("answered") };
        assert!(error.is_connect() && error.is_failure_before_head(), "{error}");
    }
}
