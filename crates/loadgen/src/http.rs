//! One persistent HTTP/1.1 client connection (hyper's `client::conn::http1`
//! over a `tokio::net::TcpStream`), and one request/response exchange on it.

use crate::body::{BodyError, BodyScan, ScannedBody};
use crate::deps::{CACHE_HEADER, DEPS_HEADER};
use crate::LoadError;
use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// Where to connect: from a base URL `http://host[:port][/]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    /// `host:port`, for the `Host` header.
    pub authority: String,
    /// The URL as given.
    pub url: String,
}

impl Endpoint {
    /// Parses a base URL. Only `http://` with an optional port and no path
    /// beyond `/` is accepted.
    pub fn parse(url: &str) -> Result<Self, LoadError> {
        let bad = |reason: &'static str| LoadError::InvalidUrl { url: url.to_string(), reason };
        let uri: http::Uri = url.parse().map_err(|_| bad("not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad("only http:// is supported"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(bad("a base URL has no path"));
        }
        let host = uri.host().ok_or_else(|| bad("no host"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
        let port = uri.port_u16().unwrap_or(80);
        let authority = uri.authority().map(|a| a.as_str().to_string()).ok_or_else(|| bad("no host"))?;
        Ok(Self { host, port, authority, url: url.to_string() })
    }
}

/// Why an exchange failed (the connection is then dropped).
#[derive(Debug)]
pub(crate) enum ExchangeError {
    /// Building the request (a path the URI grammar rejects).
    Request,
    /// The connection failed while sending or receiving.
    Io,
}

/// What came back.
#[derive(Debug)]
pub(crate) struct Exchange {
    pub status: StatusCode,
    pub deps: Option<Bytes>,
    pub cache: Option<Bytes>,
    pub body_bytes: u64,
    /// The scanned body, when asked for (see [`crate::body`]).
    pub body: Option<Result<ScannedBody, BodyError>>,
    /// The server asked to close the connection after this response.
    pub close: bool,
}

/// A live connection. Dropping it closes the socket.
pub(crate) struct Connection {
    sender: SendRequest<Empty<Bytes>>,
    driver: JoinHandle<()>,
    authority: http::HeaderValue,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Connection {
    pub(crate) async fn open(endpoint: &Endpoint) -> std::io::Result<Self> {
        let stream = TcpStream::connect((endpoint.host.as_str(), endpoint.port)).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(io_error)?;
        let driver = tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("client connection ended: {e}");
            }
        });
        let authority = http::HeaderValue::from_str(&endpoint.authority).map_err(io_error)?;
        Ok(Self { sender, driver, authority })
    }

    /// Waits until the connection can take a request (the previous response
    /// was fully read); an error means it is closed.
    pub(crate) async fn ready(&mut self) -> Result<(), ExchangeError> {
        self.sender.ready().await.map_err(|_| ExchangeError::Io)
    }

    /// Sends `method path` and reads the whole response, counting (not
    /// keeping) body bytes, and scanning the body if `scan_body`; with
    /// `last`, asks the server to close the connection after it
    /// (`Connection: close`). Call [`Connection::ready`] first, so that the
    /// caller's start time excludes waiting for the connection.
    pub(crate) async fn exchange(
        &mut self,
        method: Method,
        path: &str,
        scan_body: bool,
        last: bool,
    ) -> Result<Exchange, ExchangeError> {
        let mut builder = Request::builder().method(method.clone()).uri(path).header(header::HOST, &self.authority);
        if method == Method::PUT || method == Method::POST {
            builder = builder.header(header::CONTENT_LENGTH, "0");
        }
        if last {
            builder = builder.header(header::CONNECTION, "close");
        }
        let request = builder.body(Empty::<Bytes>::new()).map_err(|_| ExchangeError::Request)?;
        let response = self.sender.send_request(request).await.map_err(|_| ExchangeError::Io)?;
        let status = response.status();
        let headers = response.headers();
        let deps = headers.get(DEPS_HEADER).map(|v| Bytes::copy_from_slice(v.as_bytes()));
        let cache = headers.get(CACHE_HEADER).map(|v| Bytes::copy_from_slice(v.as_bytes()));
        let close = headers
            .get(header::CONNECTION)
            .is_some_and(|v| v.as_bytes().split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close")));
        let mut body = response.into_body();
        let mut body_bytes = 0u64;
        let mut scan = scan_body.then(BodyScan::new);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| ExchangeError::Io)?;
            if let Some(data) = frame.data_ref() {
                body_bytes += data.len() as u64;
                if let Some(scan) = scan.as_mut() {
                    scan.feed(data);
                }
            }
        }
        Ok(Exchange { status, deps, cache, body_bytes, body: scan.map(BodyScan::finish), close })
    }
}

fn io_error<E: std::error::Error + Send + Sync + 'static>(e: E) -> std::io::Error {
    std::io::Error::other(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_base_urls() {
        let e = Endpoint::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!((e.host.as_str(), e.port, e.authority.as_str()), ("127.0.0.1", 8080, "127.0.0.1:8080"));
        let e = Endpoint::parse("http://localhost/").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("localhost", 80));
        let e = Endpoint::parse("http://[::1]:9000").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 9000));
        for bad in ["https://127.0.0.1", "127.0.0.1:80", "http://h:1/doc/x", "http://h:1/?q", "", "http://"] {
            assert!(matches!(Endpoint::parse(bad), Err(LoadError::InvalidUrl { .. })), "{bad}");
        }
    }
}
