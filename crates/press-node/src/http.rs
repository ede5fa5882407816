//! The node's HTTP answers for a file: validators (`ETag`, `Last-Modified`),
//! HEAD, conditional requests (304, `tierstack_origin::evaluate`), single
//! byte ranges (206, 416; several ranges, or one that does not parse, are
//! answered 200 with the whole file, which RFC 9110 §14.2 allows), MIME
//! types by extension (`tierstack_origin::content_type`), and the body: the
//! bytes in memory, or a file streamed from disk in chunks.

use crate::files::FileMeta;
use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Frame;
use hyper::header::{
    HeaderMap, HeaderValue, ACCEPT_RANGES, ALLOW, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, ETAG, IF_RANGE,
    LAST_MODIFIED, RANGE,
};
use hyper::{Method, Response, StatusCode};
use std::pin::Pin;
use std::task::{Context, Poll};
use tierstack_base::time::system_now;
use tierstack_origin::{evaluate, Precondition};
use tokio::io::{AsyncRead, AsyncSeekExt, ReadBuf};

/// Bytes per chunk of a streamed file.
const STREAM_CHUNK_BYTES: u64 = 64 << 10;

/// What a node answers with: bytes in memory, or a file streamed from disk.
pub type NodeBody = Either<Full<Bytes>, FileBody>;

/// A plain-text answer (errors).
pub(crate) fn text(status: StatusCode, message: &'static str) -> Response<NodeBody> {
    tierstack_tier_http::text(status, message).map(Either::Left)
}

/// 405 with the methods a node serves.
pub(crate) fn method_not_allowed() -> Response<NodeBody> {
    let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    response.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
    response
}

/// The part of a file a GET asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    Whole,
    /// Bytes `start..end` (end exclusive, non-empty).
    Range {
        start: u64,
        end: u64,
    },
    /// 416: no byte of the range lies in the file.
    Unsatisfiable,
}

/// The part `headers` ask for of a representation of `meta` (RFC 9110
/// §14.1.2, §13.1.5): one range of `bytes=a-b`, `a-` or `-n`; an If-Range
/// whose entity tag or date does not match asks for the whole file.
pub(crate) fn part(headers: &HeaderMap, meta: &FileMeta) -> Part {
    let Some(range) = headers.get(RANGE).and_then(|v| v.to_str().ok()) else { return Part::Whole };
    if let Some(if_range) = headers.get(IF_RANGE).and_then(|v| v.to_str().ok()) {
        let if_range = if_range.trim();
        let matches = if if_range.starts_with('"') {
            if_range == meta.etag()
        } else {
            tierstack_origin::parse_http_date(if_range) == Some(meta.last_modified(system_now()))
        };
        if !matches {
            return Part::Whole;
        }
    }
    let Some(spec) = range.trim().strip_prefix("bytes=") else { return Part::Whole };
    if spec.contains(',') {
        return Part::Whole;
    }
    let Some((first, last)) = spec.trim().split_once('-') else { return Part::Whole };
    let size = meta.size;
    let (start, end) = match (first.trim(), last.trim()) {
        ("", "") => return Part::Whole,
        ("", suffix) => {
            let Ok(n) = suffix.parse::<u64>() else { return Part::Whole };
            if n == 0 {
                return Part::Unsatisfiable;
            }
            (size.saturating_sub(n), size)
        }
        (first, last) => {
            let Ok(start) = first.parse::<u64>() else { return Part::Whole };
            let end = if last.is_empty() {
                size
            } else {
                let Ok(last) = last.parse::<u64>() else { return Part::Whole };
                if last < start {
                    return Part::Whole;
                }
                last.saturating_add(1).min(size)
            };
            (start, end)
        }
    };
    if start >= size || start >= end {
        Part::Unsatisfiable
    } else {
        Part::Range { start, end }
    }
}

/// The headers every answer about a file carries.
fn validators(headers: &mut HeaderMap, meta: &FileMeta) {
    if let Ok(etag) = HeaderValue::from_str(&meta.etag()) {
        headers.insert(ETAG, etag);
    }
    if let Ok(date) = HeaderValue::from_str(&httpdate::fmt_http_date(meta.last_modified(system_now()))) {
        headers.insert(LAST_MODIFIED, date);
    }
    headers.insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
}

/// The answer that needs no bytes of the file, if there is one: 304 when
/// the client's copy is current, or HEAD's headers (as a GET's, without
/// the body).
pub(crate) fn without_body(
    method: &Method,
    request: &HeaderMap,
    meta: &FileMeta,
    decoded: &[u8],
) -> Option<Response<NodeBody>> {
    if evaluate(request, &meta.etag(), meta.last_modified(system_now())) == Precondition::NotModified {
        let mut response = Response::new(Either::Left(Full::new(Bytes::new())));
        *response.status_mut() = StatusCode::NOT_MODIFIED;
        validators(response.headers_mut(), meta);
        return Some(response);
    }
    if method == Method::HEAD {
        let mut response = Response::new(Either::Left(Full::new(Bytes::new())));
        validators(response.headers_mut(), meta);
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(tierstack_origin::content_type(decoded)));
        headers.insert(CONTENT_LENGTH, HeaderValue::from(meta.size));
        return Some(response);
    }
    None
}

/// Where a GET's bytes come from.
pub(crate) enum Content {
    Bytes(Bytes),
    /// Streamed from this open file.
    Stream(tokio::fs::File),
    /// In the node's slab, left there for a Zero send (never answered to a
    /// client: a 500 if it were).
    InSlab,
}

/// The GET answer: 200 with the whole file, 206 with the asked part, 416.
pub(crate) async fn respond(
    request: &HeaderMap,
    meta: &FileMeta,
    decoded: &[u8],
    content: Content,
) -> Response<NodeBody> {
    let part = part(request, meta);
    let (status, start, end) = match part {
        Part::Whole => (StatusCode::OK, 0, meta.size),
        Part::Range { start, end } => (StatusCode::PARTIAL_CONTENT, start, end),
        Part::Unsatisfiable => {
            let mut response = text(StatusCode::RANGE_NOT_SATISFIABLE, "range not satisfiable\n");
            validators(response.headers_mut(), meta);
            if let Ok(value) = HeaderValue::from_str(&format!("bytes */{}", meta.size)) {
                response.headers_mut().insert(CONTENT_RANGE, value);
            }
            return response;
        }
    };
    let body = match content {
        Content::Bytes(bytes) => {
            let (from, to) = (usize::try_from(start).unwrap_or(usize::MAX), usize::try_from(end).unwrap_or(0));
            if to > bytes.len() || from > to {
                return text(StatusCode::INTERNAL_SERVER_ERROR, "the file changed while it was served\n");
            }
            Either::Left(Full::new(bytes.slice(from..to)))
        }
        Content::Stream(mut file) => {
            if start > 0 && file.seek(std::io::SeekFrom::Start(start)).await.is_err() {
                return text(StatusCode::INTERNAL_SERVER_ERROR, "reading the file failed\n");
            }
            Either::Right(FileBody { file, remaining: end - start })
        }
        Content::InSlab => return text(StatusCode::INTERNAL_SERVER_ERROR, "internal: no bytes to send\n"),
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    validators(response.headers_mut(), meta);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(tierstack_origin::content_type(decoded)));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(end - start));
    if status == StatusCode::PARTIAL_CONTENT {
        if let Ok(value) = HeaderValue::from_str(&format!("bytes {start}-{}/{}", end - 1, meta.size)) {
            headers.insert(CONTENT_RANGE, value);
        }
    }
    response
}

/// A file streamed in chunks of [`STREAM_CHUNK_BYTES`]: a large file is
/// never held whole in memory. A file that shrinks under it ends the body
/// with an error (the connection is closed short, not padded).
pub struct FileBody {
    file: tokio::fs::File,
    remaining: u64,
}

impl hyper::body::Body for FileBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let want = usize::try_from(self.remaining.min(STREAM_CHUNK_BYTES)).unwrap_or(1);
        let mut chunk = vec![0u8; want];
        let mut buf = ReadBuf::new(&mut chunk);
        match Pin::new(&mut self.file).poll_read(cx, &mut buf) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len();
                if n == 0 {
                    return Poll::Ready(Some(Err(std::io::ErrorKind::UnexpectedEof.into())));
                }
                chunk.truncate(n);
                self.remaining -= n as u64;
                Poll::Ready(Some(Ok(Frame::data(Bytes::from(chunk)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(range: &str, size: u64) -> Part {
        let mut headers = HeaderMap::new();
        headers.insert(RANGE, HeaderValue::from_str(range).unwrap());
        part(&headers, &FileMeta { size, mtime_ns: 0 })
    }

    #[test]
    fn single_ranges_parse_and_the_rest_is_whole_or_unsatisfiable() {
        for (range, expected) in [
            ("bytes=0-9", Part::Range { start: 0, end: 10 }),
            ("bytes=5-", Part::Range { start: 5, end: 100 }),
            ("bytes=-10", Part::Range { start: 90, end: 100 }),
            ("bytes=-1000", Part::Range { start: 0, end: 100 }),
            ("bytes=90-1000", Part::Range { start: 90, end: 100 }),
            ("bytes=100-", Part::Unsatisfiable),
            ("bytes=-0", Part::Unsatisfiable),
            ("bytes=0-1,5-6", Part::Whole),
            ("bytes=9-1", Part::Whole),
            ("items=0-1", Part::Whole),
            ("bytes=x-1", Part::Whole),
            ("bytes=-", Part::Whole),
        ] {
            assert_eq!(ask(range, 100), expected, "{range}");
        }
        assert_eq!(ask("bytes=0-", 0), Part::Unsatisfiable, "an empty file has no byte 0");
    }

    #[test]
    fn an_if_range_that_does_not_match_asks_for_the_whole_file() {
        let meta = FileMeta { size: 100, mtime_ns: 7 };
        let mut headers = HeaderMap::new();
        headers.insert(RANGE, HeaderValue::from_static("bytes=0-1"));
        headers.insert(IF_RANGE, HeaderValue::from_str(&meta.etag()).unwrap());
        assert_eq!(part(&headers, &meta), Part::Range { start: 0, end: 2 });
        headers.insert(IF_RANGE, HeaderValue::from_static("\"other\""));
        assert_eq!(part(&headers, &meta), Part::Whole);
    }
}
