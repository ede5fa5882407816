//! The listener's front (`serve_with_front`): TLS termination with ALPN's
//! choice of HTTP/2 or HTTP/1.1, h2c with prior knowledge, certificate
//! reload, the key file's permissions, the handshake deadline under the
//! per-client cap, and HTTP/2's stream limit, idle timeout and per-stream
//! body deadline. Clients are hyper's (HTTP/1.1 and HTTP/2) over rustls
//! trusting a test authority made per test.

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Frame;
use hyper::{Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tierstack_testkit::tls::{alpn, peer_certificate, TestCa};
use tierstack_tier_http::{
    collect_limited, serve_with_front, text, Body, Front, RequestBody, ServeOptions, Stop, TlsError, TlsFiles,
    TlsServer,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::TcpListener;

const BOUND: Duration = Duration::from_secs(20);

/// Answers with the request's protocol version, its `Host` and its body.
async fn echo(request: Request<RequestBody>) -> Response<Body> {
    let version = format!("{:?}", request.version());
    let host = request.headers().get("host").and_then(|h| h.to_str().ok()).unwrap_or("-").to_string();
    match collect_limited(request.into_body(), 1 << 20).await {
        Ok(body) => text(StatusCode::OK, format!("{version} host={host} body={}", String::from_utf8_lossy(&body))),
        Err(e) => text(StatusCode::REQUEST_TIMEOUT, format!("body: {e}")),
    }
}

struct Server {
    addr: std::net::SocketAddr,
    stop: Stop,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start<H, F>(handler: H, options: ServeOptions, front: Front) -> Server
    where
        H: Fn(Request<RequestBody>) -> F + Send + Sync + 'static,
        F: std::future::Future<Output = Response<Body>> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Stop::new();
        let task = tokio::spawn(serve_with_front(listener, Arc::new(handler), stop.clone(), None, options, front));
        Server { addr, stop, task }
    }

    async fn finish(self) {
        self.stop.stop();
        tokio::time::timeout(BOUND, self.task).await.expect("the server returns").unwrap().unwrap();
    }
}

type H2 = hyper::client::conn::http2::SendRequest<Full<Bytes>>;
type H1 = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn h2<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static>(io: IO) -> (H2, tokio::task::JoinHandle<()>) {
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io)).await.unwrap();
    (
        sender,
        tokio::spawn(async move {
            let _ = connection.await;
        }),
    )
}

async fn h1<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static>(io: IO) -> H1 {
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender
}

async fn body_of(response: Response<hyper::body::Incoming>) -> String {
    String::from_utf8(collect_limited(response.into_body(), 1 << 20).await.unwrap().to_vec()).unwrap()
}

fn get_h2(path: &str) -> Request<Full<Bytes>> {
    Request::get(format!("https://localhost{path}")).body(Full::default()).unwrap()
}

fn get_h1(path: &str) -> Request<Full<Bytes>> {
    Request::get(path).header("host", "localhost").body(Full::default()).unwrap()
}

fn tls_front(files: TlsFiles, http2: bool) -> Front {
    Front { tls: Some(TlsServer::load(files, http2).unwrap()), ..Front::default() }
}

/// ALPN picks h2 for a client offering it (and the handler sees a `Host`
/// made from `:authority`, as an HTTP/1.1 client would send), HTTP/1.1 for
/// a client offering only that, and HTTP/1.1 when the listener has HTTP/2
/// off. Seen failing: with `h2` left out of the server's ALPN list the
/// first client negotiated HTTP/1.1.
#[tokio::test]
async fn alpn_picks_h2_when_offered_and_http1_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.issue(1).write(dir.path(), "server");
    let files = TlsFiles { cert, key };
    let server = Server::start(echo, ServeOptions::default(), tls_front(files.clone(), true)).await;

    let tls = TestCa::connect(ca.client_config(&[b"h2", b"http/1.1"]), server.addr).await.unwrap();
    assert_eq!(alpn(&tls).as_deref(), Some(&b"h2"[..]));
    let (mut sender, _driver) = h2(tls).await;
    let response = sender.send_request(get_h2("/a")).await.unwrap();
    assert_eq!(response.version(), Version::HTTP_2);
    assert_eq!(body_of(response).await, "HTTP/2.0 host=localhost body=");

    let tls = TestCa::connect(ca.client_config(&[b"http/1.1"]), server.addr).await.unwrap();
    assert_eq!(alpn(&tls).as_deref(), Some(&b"http/1.1"[..]));
    let mut sender = h1(tls).await;
    let response = sender.send_request(get_h1("/a")).await.unwrap();
    assert_eq!(body_of(response).await, "HTTP/1.1 host=localhost body=");
    server.finish().await;

    let server = Server::start(echo, ServeOptions::default(), tls_front(files, false)).await;
    let tls = TestCa::connect(ca.client_config(&[b"h2", b"http/1.1"]), server.addr).await.unwrap();
    assert_eq!(alpn(&tls).as_deref(), Some(&b"http/1.1"[..]), "HTTP/2 off: not offered");
    server.finish().await;
}

/// With `http2_cleartext`, a client opening with the HTTP/2 preface is
/// served HTTP/2 and an HTTP/1.1 client on the same listener HTTP/1.1;
/// without it, the preface gets no HTTP/2. Seen failing: with the two
/// protocols swapped after the preface check.
#[tokio::test]
async fn h2c_prior_knowledge_and_http1_share_a_cleartext_listener() {
    let front = Front { http2_cleartext: true, ..Front::default() };
    let server = Server::start(echo, ServeOptions::default(), front).await;
    let (mut sender, _driver) = h2(tokio::net::TcpStream::connect(server.addr).await.unwrap()).await;
    let response = sender.send_request(get_h2("/b")).await.unwrap();
    assert_eq!(body_of(response).await, "HTTP/2.0 host=localhost body=");
    let mut sender = h1(tokio::net::TcpStream::connect(server.addr).await.unwrap()).await;
    let response = sender.send_request(get_h1("/b")).await.unwrap();
    assert_eq!(body_of(response).await, "HTTP/1.1 host=localhost body=");
    server.finish().await;

    let server = Server::start(echo, ServeOptions::default(), Front::default()).await;
    let (mut sender, _driver) = h2(tokio::net::TcpStream::connect(server.addr).await.unwrap()).await;
    assert!(sender.send_request(get_h2("/b")).await.is_err(), "no h2c unless asked for");
    server.finish().await;
}

/// A reload makes new handshakes show the new certificate while a
/// connection made before keeps being served; a pair whose key does not
/// match, or an unreadable key, is refused and the pair in use stays.
/// Seen failing: with `reload` not storing the new configuration, the
/// second connection still saw the first certificate.
#[tokio::test]
async fn a_reload_switches_the_certificate_and_a_bad_pair_keeps_the_old() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let first = ca.issue(1);
    let (cert, key) = first.write(dir.path(), "server");
    let tls = TlsServer::load(TlsFiles { cert: cert.clone(), key: key.clone() }, true).unwrap();
    let front = Front { tls: Some(tls.clone()), ..Front::default() };
    let server = Server::start(echo, ServeOptions::default(), front).await;
    let config = ca.client_config(&[b"h2"]);

    let before = TestCa::connect(config.clone(), server.addr).await.unwrap();
    assert_eq!(peer_certificate(&before), first.der);
    let (mut old_connection, _driver) = h2(before).await;

    let second = ca.issue(2);
    second.write(dir.path(), "server");
    tls.reload().unwrap();
    let after = TestCa::connect(config.clone(), server.addr).await.unwrap();
    assert_eq!(peer_certificate(&after), second.der, "a new handshake shows the new certificate");
    let response = old_connection.send_request(get_h2("/still")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "the connection made before is still served");

    // The third certificate with the second's key: refused.
    let third = ca.issue(3);
    std::fs::write(&cert, &third.cert_pem).unwrap();
    assert!(matches!(tls.reload(), Err(TlsError::Config { .. })), "a key that does not match");
    std::fs::write(&cert, &second.cert_pem).unwrap();
    std::fs::write(&key, "not a key").unwrap();
    assert!(matches!(tls.reload(), Err(TlsError::NoKey { .. })), "a key file without a key");
    let still = TestCa::connect(config, server.addr).await.unwrap();
    assert_eq!(peer_certificate(&still), second.der, "the pair in use stays");
    assert_eq!(tls.reload_counts(), (1, 2));
    server.finish().await;
}

/// A key file that group or others may read is refused at load, with the
/// fix in the message. Seen failing: reading the key with `std::fs::read`
/// instead of the checked reader accepted it.
#[test]
fn a_key_others_may_read_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = TestCa::new().issue(1).write(dir.path(), "server");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let refused = TlsServer::load(TlsFiles { cert, key }, true).err().expect("refused");
    let message = refused.to_string();
    assert!(matches!(refused, TlsError::Key(_)), "{message}");
    assert!(message.contains("0644") && message.contains("chmod 600"), "{message}");
}

/// Reads until the server closes the connection (end of stream or an
/// error), within [`BOUND`].
async fn closed_by_server(stream: &mut tokio::net::TcpStream) {
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(BOUND, stream.read(&mut buf)).await.expect("the server closes it");
    assert!(matches!(read, Ok(0) | Err(_)), "closed, not answered: {read:?}");
}

/// A client that opens TCP and says nothing holds its per-client slot only
/// until the handshake deadline: while it holds it another connection from
/// the same address is closed at once, and once the deadline has closed
/// the silent one, a new client is served. (No header-read timeout here:
/// only the handshake deadline can close it.) Seen failing: with the
/// handshake deadline made 1,000 times longer, the silent connection stayed.
#[tokio::test]
async fn a_silent_tls_client_is_closed_at_the_handshake_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.issue(1).write(dir.path(), "server");
    let mut front = tls_front(TlsFiles { cert, key }, true);
    front.tls_handshake_timeout = Some(Duration::from_millis(300));
    let options = ServeOptions { max_connections_per_client: Some(1), ..ServeOptions::default() };
    let server = Server::start(echo, options, front).await;
    let mut silent = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let mut second = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    closed_by_server(&mut second).await;
    closed_by_server(&mut silent).await;
    let deadline = tokio::time::Instant::now() + BOUND;
    // The slot is freed once the silent connection's task has ended.
    let served = loop {
        if let Ok(tls) = TestCa::connect(ca.client_config(&[b"h2"]), server.addr).await {
            let (mut sender, _driver) = h2(tls).await;
            if let Ok(response) = sender.send_request(get_h2("/")).await {
                break response;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "a new client is served once the silent one is gone");
        tokio::task::yield_now().await;
    };
    assert_eq!(served.status(), StatusCode::OK);
    server.finish().await;
}

/// At most `max_concurrent_streams` requests of one connection are in the
/// handler at once; the others wait (a client that knows the limit) or are
/// refused with REFUSED_STREAM (one that opened them before it learnt the
/// limit, as hyper's client may), never run beside them. Seen failing:
/// with the limit not passed to hyper's builder, all four entered.
#[tokio::test]
async fn the_stream_limit_holds_requests_beyond_it() {
    let active = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let (a, m, r) = (active.clone(), most.clone(), release.clone());
    let handler = move |_request: Request<RequestBody>| {
        let (active, most, release) = (a.clone(), m.clone(), r.clone());
        async move {
            let now = active.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            release.acquire().await.unwrap().forget();
            active.fetch_sub(1, Ordering::SeqCst);
            text(StatusCode::OK, "done")
        }
    };
    let mut front = Front { http2_cleartext: true, ..Front::default() };
    front.http2.max_concurrent_streams = 2;
    let server = Server::start(handler, ServeOptions::default(), front).await;
    let (sender, _driver) = h2(tokio::net::TcpStream::connect(server.addr).await.unwrap()).await;
    let requests: Vec<_> = (0..4)
        .map(|i| {
            let mut sender = sender.clone();
            tokio::spawn(async move { sender.send_request(get_h2(&format!("/{i}"))).await })
        })
        .collect();
    let deadline = tokio::time::Instant::now() + BOUND;
    while active.load(Ordering::SeqCst) < 2 {
        assert!(tokio::time::Instant::now() < deadline, "two requests reach the handler");
        tokio::task::yield_now().await;
    }
    // Give the others every chance to enter: they would by now if they could.
    let settle = tokio::time::Instant::now() + Duration::from_millis(300);
    while tokio::time::Instant::now() < settle && active.load(Ordering::SeqCst) <= 2 {
        tokio::task::yield_now().await;
    }
    assert_eq!(active.load(Ordering::SeqCst), 2, "no third stream while two are open");
    release.add_permits(4);
    let mut answered = 0;
    for request in requests {
        match tokio::time::timeout(BOUND, request).await.unwrap().unwrap() {
            Ok(response) => {
                assert_eq!(response.status(), StatusCode::OK);
                answered += 1;
            }
            Err(e) => assert!(format!("{e:?}").contains("REFUSED_STREAM"), "{e:?}"),
        }
    }
    assert!(answered >= 2, "the two within the limit are answered");
    assert_eq!(most.load(Ordering::SeqCst), 2);
    server.finish().await;
}

/// A request body that sends one chunk and then nothing, forever.
struct Stalling(bool);

impl hyper::body::Body for Stalling {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.0 {
            return Poll::Pending;
        }
        self.0 = true;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"part")))))
    }
}

/// On HTTP/2 the body deadline is the stream's: a stream whose body stalls
/// fails at its deadline (the handler sees an error), while another stream
/// of the same connection is answered, meanwhile and after. Seen failing:
/// without the stream's deadline the stalled body's handler never ended.
#[tokio::test]
async fn an_h2_stream_whose_body_stalls_fails_alone_at_its_deadline() {
    let options = ServeOptions { body_read_timeout: Some(Duration::from_millis(300)), ..ServeOptions::default() };
    let front = Front { http2_cleartext: true, ..Front::default() };
    let server = Server::start(echo, options, front).await;
    let io = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (sender, connection) = hyper::client::conn::http2::handshake::<_, _, Either<Full<Bytes>, Stalling>>(
        TokioExecutor::new(),
        TokioIo::new(io),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let quick = |sender: &mut hyper::client::conn::http2::SendRequest<Either<Full<Bytes>, Stalling>>| {
        let request = Request::get("https://localhost/quick").body(Either::Left(Full::default())).unwrap();
        sender.send_request(request)
    };
    let mut stalled_sender = sender.clone();
    let stalled = tokio::spawn(async move {
        let request = Request::post("https://localhost/slow").body(Either::Right(Stalling(false))).unwrap();
        stalled_sender.send_request(request).await
    });
    let mut other = sender.clone();
    let response = quick(&mut other).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "another stream is answered meanwhile");
    let response = tokio::time::timeout(BOUND, stalled).await.expect("the stalled stream ends").unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
    assert!(body_of(response).await.contains("body timeout"));
    let response = quick(&mut other).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "and after: the connection lives on");
    server.finish().await;
}

/// HTTP/2's idle timeout is the header-read timeout: a connection with no
/// stream open is closed after it, while one whose only stream takes
/// longer than it to answer is not cut. Seen failing: with `StreamOpen`
/// not counting its stream, the slow answer was cut.
#[tokio::test]
async fn an_idle_h2_connection_is_closed_and_a_slow_stream_is_not_cut() {
    let timeout = Duration::from_millis(200);
    let handler = move |_request: Request<RequestBody>| async move {
        tokio::time::sleep(timeout * 3).await;
        text(StatusCode::OK, "slow")
    };
    let options = ServeOptions { header_read_timeout: Some(timeout), ..ServeOptions::default() };
    let front = Front { http2_cleartext: true, ..Front::default() };
    let server = Server::start(handler, options, front).await;
    let (mut sender, driver) = h2(tokio::net::TcpStream::connect(server.addr).await.unwrap()).await;
    let response = sender.send_request(get_h2("/")).await.unwrap();
    assert_eq!(body_of(response).await, "slow");
    tokio::time::timeout(BOUND, driver).await.expect("the idle connection is closed").unwrap();
    server.finish().await;
}

/// A connection still in its TLS handshake counts as waiting on its
/// client: at the connection limit a fresh client displaces a silent one
/// at once (the handshake deadline, a minute here, cannot be what freed
/// the slot), and the silent one is closed. Seen failing: with the
/// handshake not raced against the watcher's word, the fresh client waited
/// past this test's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_listener_displaces_a_connection_stuck_in_its_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.issue(1).write(dir.path(), "server");
    let mut front = tls_front(TlsFiles { cert, key }, true);
    front.tls_handshake_timeout = Some(Duration::from_secs(60));
    let options = ServeOptions { max_connections: Some(1), ..ServeOptions::default() };
    let server = Server::start(echo, options, front).await;
    let mut silent = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let fresh = async {
        let tls = TestCa::connect(ca.client_config(&[b"h2"]), server.addr).await.unwrap();
        let (mut sender, _driver) = h2(tls).await;
        sender.send_request(get_h2("/")).await.unwrap()
    };
    let response = tokio::time::timeout(BOUND, fresh).await.expect("the fresh client is served at once");
    assert_eq!(response.status(), StatusCode::OK);
    closed_by_server(&mut silent).await;
    server.finish().await;
}
