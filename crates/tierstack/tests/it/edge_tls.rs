//! The proxy at the edge (issue 32): TLS termination and HTTP/2, as
//! processes. An HTTP/2 client over TLS gets the same misses, hits and
//! coherent invalidation as an HTTP/1.1 one, from the same cache entries;
//! h2c with prior knowledge shares the cleartext listener with HTTP/1.1;
//! SIGHUP switches the certificate new handshakes see and keeps the old
//! one when the new pair is bad; a key others may read stops the proxy at
//! start with the fix in the message; a silent client is closed at the
//! handshake deadline.

use crate::{exe, start_deployment};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tierstack_cluster::Backend;
use tierstack_deploy::deployment::{Deployment, DeploymentConfig, DeploymentOptions, ExtraArgs};
use tierstack_deploy::process::free_loopback_port;
use tierstack_testkit::child::ChildProcess;
use tierstack_testkit::http;
use tierstack_testkit::tls::{peer_certificate, TestCa};
use tierstack_workload::Trace;

const DOCS: usize = 5;
const BOUND: Duration = Duration::from_secs(20);

fn deploy(proxy_flags: Vec<String>) -> Deployment {
    let config = DeploymentConfig {
        exe: exe(),
        backend: Backend::Shm,
        mode: "poll".into(),
        proxies: 1,
        compute_threads: 0,
        documents: "zipf".into(),
        docs: DOCS,
        seed: 1,
        pin: false,
    };
    let extra = ExtraArgs { proxy: proxy_flags, ..ExtraArgs::default() };
    start_deployment(&config, &DeploymentOptions::default(), &extra)
}

fn addr(url: &str) -> SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// What a GET through the proxy came to.
#[derive(Debug, PartialEq)]
struct Got {
    status: u16,
    cache: String,
    deps: String,
    body: Bytes,
}

/// A client of one protocol, on one connection.
enum Client {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Client {
    async fn over<IO>(io: IO, h2: bool) -> Client
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        if h2 {
            let (sender, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io)).await.unwrap();
            tokio::spawn(connection);
            Client::H2(sender)
        } else {
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await.unwrap();
            tokio::spawn(connection);
            Client::H1(sender)
        }
    }

    async fn get(&mut self, authority: &str, path: &str) -> Got {
        let response = match self {
            // HTTP/2 names the authority in `:authority`, HTTP/1.1 in `Host`.
            Client::H2(sender) => {
                let request = Request::get(format!("https://{authority}{path}")).body(Full::default()).unwrap();
                let response = sender.send_request(request).await.unwrap();
                assert_eq!(response.version(), hyper::Version::HTTP_2);
                response
            }
            Client::H1(sender) => {
                let request = Request::get(path).header("host", authority).body(Full::default()).unwrap();
                sender.send_request(request).await.unwrap()
            }
        };
        let field = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let (status, cache, deps) = (response.status().as_u16(), field("x-cache"), field("x-tierstack-deps"));
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Got { status, cache, deps, body }
    }
}

/// Over one TLS listener, HTTP/2 (ALPN h2) and HTTP/1.1 (ALPN http/1.1)
/// share the cache: a miss over h2, then a hit over h2 and over h1 with the
/// same body and dependencies; after an update through the application
/// tier, the next GET over h2 serves the new page (never the old), and h1
/// then hits that new copy. Seen failing: with an h2 request's authority
/// dropped (its URI cut to origin-form, no `Host` made from `:authority`),
/// the HTTP/1.1 client missed the entry HTTP/2 stored.
#[test]
fn h2_over_tls_gets_the_same_hits_misses_and_invalidation_as_http1() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.issue(1).write(dir.path(), "edge");
    let deployment =
        deploy(vec!["--tls-cert".into(), cert.display().to_string(), "--tls-key".into(), key.display().to_string()]);
    let proxy = addr(&deployment.proxy_urls[0]);
    let authority = format!("localhost:{}", proxy.port());
    let path = Trace::zipf(0.9, DOCS).unwrap().documents()[0].path();
    runtime().block_on(async {
        let tls = TestCa::connect(ca.client_config(&[b"h2", b"http/1.1"]), proxy).await.unwrap();
        let mut h2 = Client::over(tls, true).await;
        let tls = TestCa::connect(ca.client_config(&[b"http/1.1"]), proxy).await.unwrap();
        let mut h1 = Client::over(tls, false).await;

        let first = h2.get(&authority, &path).await;
        assert_eq!((first.status, first.cache.as_str()), (200, "MISS"), "{first:?}");
        let again = h2.get(&authority, &path).await;
        assert_eq!((again.status, again.cache.as_str()), (200, "HIT"));
        assert_eq!((&again.deps, &again.body), (&first.deps, &first.body));
        let other = h1.get(&authority, &path).await;
        assert_eq!(other, Got { cache: "HIT".into(), ..again }, "HTTP/1.1 hits the entry HTTP/2 stored");

        deployment.update(&path).unwrap();
        let updated = h2.get(&authority, &path).await;
        assert_eq!(updated.status, 200);
        assert_ne!(updated.deps, first.deps, "after the update the h2 client gets the new page: {updated:?}");
        assert_ne!(updated.cache, "HIT", "the old copy is not served");
        let other = h1.get(&authority, &path).await;
        assert_eq!((other.cache.as_str(), &other.deps, &other.body), ("HIT", &updated.deps, &updated.body));
    });
    deployment.stop().unwrap();
}

/// With `--http2-cleartext` a client with prior knowledge speaks HTTP/2 on
/// the plain listener and an HTTP/1.1 client on the same port hits what
/// it stored. Seen failing: without the flag passed on to the listener.
#[test]
fn h2c_with_prior_knowledge_shares_the_cleartext_listener() {
    let deployment = deploy(vec!["--http2-cleartext".into()]);
    let proxy = addr(&deployment.proxy_urls[0]);
    let authority = proxy.to_string();
    let path = Trace::zipf(0.9, DOCS).unwrap().documents()[1].path();
    let first = runtime().block_on(async {
        let mut h2 = Client::over(tokio::net::TcpStream::connect(proxy).await.unwrap(), true).await;
        h2.get(&authority, &path).await
    });
    assert_eq!((first.status, first.cache.as_str()), (200, "MISS"));
    let hit = http::get(proxy, &path).unwrap();
    assert_eq!((hit.status, hit.header("x-cache")), (200, Some("HIT")));
    assert_eq!(hit.body, first.body.to_vec());
    deployment.stop().unwrap();
}

/// A proxy with TLS in front of an upstream that is never asked (the
/// tests below only shake hands), standard error captured.
fn tls_proxy(cert: &Path, key: &Path, extra: &[&str]) -> (ChildProcess, SocketAddr) {
    let listen = free_loopback_port().unwrap();
    let mut args = vec![
        "proxy".to_string(),
        "--listen".into(),
        listen.to_string(),
        "--upstream".into(),
        "http://127.0.0.1:9".into(),
        "--mode".into(),
        "ttl".into(),
        "--tls-cert".into(),
        cert.display().to_string(),
        "--tls-key".into(),
        key.display().to_string(),
        "--stop-on-stdin-eof".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    (ChildProcess::tierstack(&exe(), &args), listen)
}

/// The certificate a new handshake with `proxy` shows.
fn shown(ca: &TestCa, proxy: SocketAddr) -> Vec<u8> {
    runtime().block_on(async { peer_certificate(&TestCa::connect(ca.client_config(&[b"h2"]), proxy).await.unwrap()) })
}

/// SIGHUP makes new handshakes show the new certificate; a bad pair after
/// it is refused with a log line and the certificate in use stays; the
/// process keeps running throughout. Seen failing: with the SIGHUP
/// handler not installed, the first certificate was shown until the
/// deadline.
#[test]
fn sighup_reloads_the_certificate_and_a_bad_pair_keeps_the_old() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (first, second, third) = (ca.issue(1), ca.issue(2), ca.issue(3));
    let (cert, key) = first.write(dir.path(), "edge");
    let (mut proxy, listen) = tls_proxy(&cert, &key, &[]);
    proxy.wait_ready();
    assert_eq!(shown(&ca, listen), first.der);

    second.write(dir.path(), "edge");
    proxy.signal(libc::SIGHUP);
    let deadline = tierstack_base::time::instant_now() + BOUND;
    while shown(&ca, listen) != second.der {
        assert!(tierstack_base::time::instant_now() < deadline, "SIGHUP did not switch: {}", proxy.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }

    // The third certificate with the second's key: refused, logged.
    std::fs::write(&cert, &third.cert_pem).unwrap();
    proxy.signal(libc::SIGHUP);
    let deadline = tierstack_base::time::instant_now() + BOUND;
    while !proxy.stderr().contains("previous pair stays in use") {
        assert!(tierstack_base::time::instant_now() < deadline, "no refusal logged: {}", proxy.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(shown(&ca, listen), second.der, "the pair in use stays");
    assert!(proxy.try_wait().is_none(), "SIGHUP does not stop the proxy");
    assert!(proxy.finish().success());
}

/// A key file with mode 0644 stops the proxy at start, the message naming
/// the file and the fix. Seen failing: with the key read unchecked, the
/// proxy started.
#[test]
fn a_key_file_others_may_read_is_refused_at_startup() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = TestCa::new().issue(1).write(dir.path(), "edge");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (mut proxy, _) = tls_proxy(&cert, &key, &[]);
    let deadline = tierstack_base::time::instant_now() + BOUND;
    let status = loop {
        if let Some(status) = proxy.try_wait() {
            break status;
        }
        assert!(tierstack_base::time::instant_now() < deadline, "the proxy started with a readable key");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let stderr = proxy.stderr();
    assert!(stderr.contains("0644") && stderr.contains("chmod 600") && stderr.contains("edge.key"), "{stderr}");
}

/// A client that connects and sends nothing is closed at the handshake
/// deadline, with no header-read timeout to do it. Seen failing: with
/// `--tls-handshake-timeout-ms` not passed on, it stayed open to the
/// default's 10 s (past this test's bound, set shorter for it).
#[test]
fn a_silent_client_is_closed_at_the_handshake_deadline() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = TestCa::new().issue(1).write(dir.path(), "edge");
    let flags = ["--tls-handshake-timeout-ms", "300", "--header-read-timeout-ms", "0"];
    let (mut proxy, listen) = tls_proxy(&cert, &key, &flags);
    proxy.wait_ready();
    let mut silent = std::net::TcpStream::connect(listen).unwrap();
    // Shorter than the default deadline: only the flag's can close it in time.
    silent.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 16];
    match silent.read(&mut buf) {
        Ok(0) => {}
        other => panic!("expected the proxy to close the connection, got {other:?}"),
    }
    assert!(proxy.finish().success());
}
