//! A server with the limits under test, its open-connection count, and the
//! raw clients the tests play (slow, silent, fresh).

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tierstack_tier_http::{collect_limited, serve_with_options, text, ConnectionHook, RequestBody, ServeOptions, Stop};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;

/// `GET /big`'s body: far more than the socket buffers hold when the
/// client reads nothing (the server's send buffer is [`SEND_BUFFER_BYTES`]).
pub(crate) const BIG_BYTES: usize = 1 << 20;

fn big() -> Bytes {
    static BIG: OnceLock<Bytes> = OnceLock::new();
    BIG.get_or_init(|| Bytes::from(vec![b'x'; BIG_BYTES])).clone()
}

const BACKLOG: u32 = 4096;
const SEND_BUFFER_BYTES: u32 = 64 << 10;

pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    /// Connections the server holds open.
    pub(crate) open: watch::Receiver<usize>,
    /// Connections the server has accepted (and admitted) so far.
    pub(crate) accepted: watch::Receiver<usize>,
    pub(crate) stop: Stop,
    /// Told each time a `/held` request's body is in and its wait begins.
    pub(crate) held_entered: Arc<tokio::sync::Notify>,
}

impl Server {
    /// Waits (at most `within`) until the server holds at most `count` connections.
    pub(crate) async fn open_at_most(&mut self, count: usize, within: Duration) -> bool {
        tokio::time::timeout(within, self.open.wait_for(|open| *open <= count)).await.is_ok()
    }
}

/// Counts a connection while it is held.
struct Counted(watch::Sender<usize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.send_modify(|open| *open -= 1);
    }
}

/// Serves `/big` (a large body), `/body` (reads the whole request body,
/// answers its length), `/held` (reads the body, then waits `held` before
/// answering) and anything else (`fresh`).
pub(crate) async fn server(options: ServeOptions, held: Duration) -> Server {
    // A backlog as deep as the system allows (somaxconn), as a server
    // facing crowds sets it: a burst beyond it waits in SYN retries of a
    // second and more, whatever the server does.
    let socket = TcpSocket::new_v4().unwrap();
    // Accepted sockets inherit it: on loopback the kernel would otherwise
    // let a silent reader's connection buffer megabytes, 10,000 times over.
    socket.set_send_buffer_size(SEND_BUFFER_BYTES).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(BACKLOG).unwrap();
    let addr = listener.local_addr().unwrap();
    let held_entered = Arc::new(tokio::sync::Notify::new());
    let entered = held_entered.clone();
    let handler = Arc::new(move |request: Request<RequestBody>| {
        let entered = entered.clone();
        async move {
            match request.uri().path() {
                "/big" => Response::new(Full::new(big())),
                "/body" | "/held" => {
                    let held = if request.uri().path() == "/held" { held } else { Duration::ZERO };
                    match collect_limited(request.into_body(), 2 << 20).await {
                        Ok(body) => {
                            if !held.is_zero() {
                                entered.notify_one();
                                tokio::time::sleep(held).await;
                            }
                            text(StatusCode::OK, format!("{} bytes", body.len()))
                        }
                        Err(e) => text(StatusCode::BAD_REQUEST, e),
                    }
                }
                _ => text(StatusCode::OK, "fresh"),
            }
        }
    });
    let (open_tx, open) = watch::channel(0usize);
    let (accepted_tx, accepted) = watch::channel(0usize);
    let hook: ConnectionHook = Arc::new(move || {
        accepted_tx.send_modify(|accepted| *accepted += 1);
        open_tx.send_modify(|open| *open += 1);
        Box::new(Counted(open_tx.clone()))
    });
    let stop = Stop::new();
    tokio::spawn(serve_with_options(listener, handler, stop.clone(), Some(hook), options));
    Server { addr, open, accepted, stop, held_entered }
}

/// A connection whose receive buffer is small, so that a client that does
/// not read stops the server's writes after a few KiB.
pub(crate) async fn connect_small(addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(addr).await.unwrap()
}

/// A POST head promising 1,000,000 bytes of body, and 2 of them.
pub(crate) const SLOW_BODY: &[u8] = b"POST /body HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nab";
/// A request for a large answer (the client then never reads).
pub(crate) const SLOW_READER: &[u8] = b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n";

/// A fresh client's `GET /`: the whole answer, or why not.
pub(crate) async fn fresh_get(addr: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// Waits (at most `within`) until the server ends `stream` (end of stream or
/// reset), discarding whatever it sent before.
pub(crate) async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = vec![0u8; 64 << 10];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// Whether the server has closed `stream` already (without waiting).
pub(crate) async fn closed_now(stream: &mut TcpStream) -> bool {
    closed_within(stream, Duration::from_millis(1)).await
}
