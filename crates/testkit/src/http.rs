//! A minimal HTTP/1.1 client for end-to-end tests: one request per
//! connection (`Connection: close`), the whole answer read to the end, a
//! chunked body decoded. Written by hand on purpose: a test that checks
//! what a server puts on the wire should see the bytes, not a client
//! library's reading of them.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long connecting may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the answer may take to arrive in full.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A whole response.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    /// The status line and header lines, as received (without the blank line).
    pub head: String,
    /// The body, de-chunked when it came chunked.
    pub body: Vec<u8>,
}

impl Response {
    /// The value of header `name` (case-insensitive), trimmed.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head
            .split("\r\n")
            .skip(1)
            .filter_map(|line| line.split_once(':'))
            .find(|(n, _)| n.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim())
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Parses a whole response as read from the connection.
    pub fn parse(raw: &[u8]) -> std::io::Result<Response> {
        let bad =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("malformed response: {what}"));
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| bad("no end of head"))?;
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| bad("status line"))?;
        let mut response = Response { status, head, body: raw[split + 4..].to_vec() };
        if response.header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
            let (mut body, mut rest) = (Vec::new(), &response.body[..]);
            loop {
                let eol = rest.windows(2).position(|w| w == b"\r\n").ok_or_else(|| bad("chunk size line"))?;
                let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..eol]).trim(), 16)
                    .map_err(|_| bad("chunk size"))?;
                rest = &rest[eol + 2..];
                if size == 0 {
                    break;
                }
                body.extend_from_slice(rest.get(..size).ok_or_else(|| bad("short chunk"))?);
                rest = rest.get(size + 2..).unwrap_or_default();
            }
            response.body = body;
        }
        Ok(response)
    }
}

/// `GET path` from `addr`.
pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<Response> {
    exchange(addr, &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"))
}

/// `method path` to `addr` with an empty body and `extra_headers` (each
/// `"Name: value"`).
pub fn request(addr: SocketAddr, method: &str, path: &str, extra_headers: &[&str]) -> std::io::Result<Response> {
    let extra: String = extra_headers.iter().map(|h| format!("{h}\r\n")).collect();
    exchange(
        addr,
        &format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"),
    )
}

/// Writes `request` on a new connection to `addr` and reads the answer to its end.
pub fn exchange(addr: SocketAddr, request: &str) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    Response::parse(&raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked_bodies_and_finds_headers() {
        let plain = Response::parse(b"HTTP/1.1 200 OK\r\nX-Cache: HIT\r\nContent-Length: 2\r\n\r\nhi").unwrap();
        assert_eq!((plain.status, plain.header("x-cache"), plain.text().as_str()), (200, Some("HIT"), "hi"));
        assert_eq!(plain.header("x-missing"), None);
        let chunked = Response::parse(
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((chunked.status, chunked.body.as_slice()), (404, &b"abcde"[..]));
        assert!(Response::parse(b"HTTP/1.1 200 OK\r\n").is_err(), "no end of head");
        assert!(Response::parse(b"garbage\r\n\r\n").is_err(), "no status");
    }
}
