//! The optional access log: one Combined Log Format line per request on
//! the client listener (`host - - [date] "METHOD target HTTP/1.1" status
//! bytes "referer" "user-agent"`), which `tierstack load` replays as the trace `clf:PATH`.
//! Lines go through a channel to a writer thread, so the request path never
//! waits for the disk; a full channel drops the line (counted).

use hyper::header::{CONTENT_LENGTH, REFERER, USER_AGENT};
use hyper::{HeaderMap, Method, StatusCode};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

/// Lines waiting for the writer at most.
const PENDING_MAX: usize = 65_536;

/// The request side of a line, taken before the request is handled.
pub(crate) struct Pending {
    host: String,
    request_line: String,
    referer: String,
    user_agent: String,
    head: bool,
}

pub(crate) struct AccessLog {
    lines: mpsc::SyncSender<String>,
    pub dropped: AtomicU64,
}

impl AccessLog {
    /// Appends to `path` (created if missing) from a thread of its own.
    pub(crate) fn open(path: &Path) -> std::io::Result<AccessLog> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        let (lines, receiver) = mpsc::sync_channel::<String>(PENDING_MAX);
        std::thread::Builder::new().name("access-log".into()).spawn(move || {
            let mut out = std::io::BufWriter::new(file);
            while let Ok(line) = receiver.recv() {
                let mut ok = out.write_all(line.as_bytes()).is_ok();
                // Flush whenever nothing more is waiting.
                while let Ok(line) = receiver.try_recv() {
                    ok &= out.write_all(line.as_bytes()).is_ok();
                }
                if !ok || out.flush().is_err() {
                    tracing::warn!("access log: write failed");
                }
            }
        })?;
        Ok(AccessLog { lines, dropped: AtomicU64::new(0) })
    }

    /// Logs the response to `pending`.
    pub(crate) fn log(&self, pending: Pending, status: StatusCode, response: &HeaderMap) {
        let bytes = match response.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()) {
            _ if pending.head => "0".to_string(),
            Some(length) if length.bytes().all(|b| b.is_ascii_digit()) && !length.is_empty() => length.to_string(),
            _ => "-".to_string(),
        };
        let line = format!(
            "{} - - [{}] \"{}\" {} {} \"{}\" \"{}\"\n",
            pending.host,
            clf_now(),
            pending.request_line,
            status.as_u16(),
            bytes,
            pending.referer,
            pending.user_agent
        );
        if self.lines.try_send(line).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A field value safe inside the log's quotes (no quote, backslash or
/// control byte), `-` if absent.
fn quoted(value: Option<&hyper::header::HeaderValue>) -> String {
    match value {
        None => "-".into(),
        Some(value) => String::from_utf8_lossy(value.as_bytes())
            .chars()
            .map(|c| if c == '"' || c == '\\' || c.is_control() { '_' } else { c })
            .collect(),
    }
}

impl Pending {
    pub(crate) fn of(
        peer: Option<std::net::SocketAddr>,
        method: &Method,
        target: &str,
        headers: &HeaderMap,
    ) -> Pending {
        // The target as logged: no spaces or quotes (percent-encoded by
        // any valid client; replaced here if not).
        let target: String = target.chars().map(|c| if c == ' ' || c == '"' { '_' } else { c }).collect();
        Pending {
            host: peer.map_or("-".into(), |p| p.ip().to_string()),
            request_line: format!("{method} {target} HTTP/1.1"),
            referer: quoted(headers.get(REFERER)),
            user_agent: quoted(headers.get(USER_AGENT)),
            head: method == Method::HEAD,
        }
    }
}

/// Now as `dd/Mon/yyyy:hh:mm:ss +0000`, from the HTTP date
/// (`Sun, 06 Nov 1994 08:49:37 GMT`).
fn clf_now() -> String {
    let http = httpdate::fmt_http_date(tierstack_base::time::system_now());
    let parts: Vec<&str> = http.split(' ').collect();
    match parts.as_slice() {
        [_, day, month, year, time, _] => format!("{day}/{month}/{year}:{time} +0000"),
        _ => "01/Jan/1970:00:00:00 +0000".into(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates_are_in_the_common_log_formats_shape() {
        let date = super::clf_now();
        let bytes = date.as_bytes();
        assert_eq!(date.len(), "06/Nov/1994:08:49:37 +0000".len(), "{date}");
        assert_eq!((bytes[2], bytes[6], bytes[11]), (b'/', b'/', b':'), "{date}");
        assert!(date.ends_with(" +0000"));
    }
}
