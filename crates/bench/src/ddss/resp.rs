//! A minimal RESP (Redis protocol) client, PING, SET and GET only: what the
//! `tierstack bench ddss` comparison needs of a local `redis-server`.
//! Replies are bounded ([`RESP_REPLY_BYTES_MAX`]); errors are the DDSS
//! benchmark's (`DdssError::Ipc`), so one `Result` runs through a
//! measurement.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use tierstack_ddss::{DdssError, Result};

/// Longest RESP reply the client accepts.
pub const RESP_REPLY_BYTES_MAX: usize = 16 << 20;

/// A minimal RESP (Redis protocol) client: PING, SET and GET only.
pub struct RespClient {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

fn resp_error(message: impl Into<String>) -> DdssError {
    DdssError::Ipc(format!("redis: {}", message.into()))
}

impl RespClient {
    pub fn connect(addr: &str) -> Result<Self> {
        let stream = TcpStream::connect(addr).map_err(|e| resp_error(format!("connect {addr}: {e}")))?;
        stream.set_nodelay(true).map_err(|e| resp_error(e.to_string()))?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| resp_error(e.to_string()))?;
        let writer = stream.try_clone().map_err(|e| resp_error(e.to_string()))?;
        Ok(Self { reader: BufReader::new(stream), writer })
    }

    fn command(&mut self, parts: &[&[u8]]) -> Result<()> {
        let mut out = format!("*{}\r\n", parts.len()).into_bytes();
        for part in parts {
            out.extend_from_slice(format!("${}\r\n", part.len()).as_bytes());
            out.extend_from_slice(part);
            out.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&out).map_err(|e| resp_error(format!("send: {e}")))
    }

    fn line(&mut self) -> Result<Vec<u8>> {
        let mut line = Vec::new();
        (&mut self.reader)
            .take(RESP_REPLY_BYTES_MAX as u64)
            .read_until(b'\n', &mut line)
            .map_err(|e| resp_error(e.to_string()))?;
        if !line.ends_with(b"\r\n") {
            return Err(resp_error("truncated reply"));
        }
        line.truncate(line.len() - 2);
        Ok(line)
    }

    fn simple(&mut self, expected: &[u8]) -> Result<()> {
        let line = self.line()?;
        if line.first() == Some(&b'+') && &line[1..] == expected {
            Ok(())
        } else {
            Err(resp_error(format!("unexpected reply {:?}", String::from_utf8_lossy(&line))))
        }
    }

    pub fn ping(&mut self) -> Result<()> {
        self.command(&[b"PING"])?;
        self.simple(b"PONG")
    }

    pub fn set(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.command(&[b"SET", key, value])?;
        self.simple(b"OK")
    }

    /// The value, or `None` for a missing key.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.command(&[b"GET", key])?;
        let line = self.line()?;
        if line.first() != Some(&b'$') {
            return Err(resp_error(format!("unexpected reply {:?}", String::from_utf8_lossy(&line))));
        }
        let len: i64 = std::str::from_utf8(&line[1..])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| resp_error("bad bulk length"))?;
        if len < 0 {
            return Ok(None);
        }
        let len = usize::try_from(len).map_err(|_| resp_error("bad bulk length"))?;
        if len > RESP_REPLY_BYTES_MAX {
            return Err(resp_error("reply too large"));
        }
        let mut value = vec![0u8; len + 2];
        self.reader.read_exact(&mut value).map_err(|e| resp_error(e.to_string()))?;
        if !value.ends_with(b"\r\n") {
            return Err(resp_error("bulk reply not terminated"));
        }
        value.truncate(len);
        Ok(Some(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A fake RESP server on loopback that answers a scripted sequence, to
    /// test the client's parsing without Redis.
    fn fake_server(replies: &'static [u8]) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut writer = stream.try_clone().unwrap();
            let mut reader = BufReader::new(stream);
            let mut buf = Vec::new();
            // Read one command's first line, then send everything.
            reader.read_until(b'\n', &mut buf).unwrap();
            writer.write_all(replies).unwrap();
            // Keep the connection until the client goes away.
            let _ = reader.read_to_end(&mut buf);
        });
        addr
    }

    #[test]
    fn resp_client_parses_replies() {
        let addr = fake_server(b"+PONG\r\n+OK\r\n$3\r\nabc\r\n$-1\r\n-ERR nope\r\n");
        let mut client = RespClient::connect(&addr).unwrap();
        client.ping().unwrap();
        client.set(b"k", b"abc").unwrap();
        assert_eq!(client.get(b"k").unwrap(), Some(b"abc".to_vec()));
        assert_eq!(client.get(b"missing").unwrap(), None);
        assert!(client.set(b"k", b"v").is_err(), "an error reply is an error");
    }
}
