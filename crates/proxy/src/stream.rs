//! The proxy's response body: a whole one (hits, small answers) or one that
//! streams a miss from the upstream as it arrives, through a bounded
//! channel fed by the task that also tees it into the cache entry.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// Frames in flight between the upstream reader and the client: the
/// proxy holds at most this many of a streamed body (plus what it tees).
pub(crate) const STREAM_FRAMES: usize = 8;

/// The upstream's body broke off (the client's connection is then ended,
/// so it never mistakes a part for the whole).
#[derive(Debug, thiserror::Error)]
#[error("upstream body: {0}")]
pub struct StreamError(pub String);

/// A response body of the proxy.
pub enum ProxyBody {
    Whole(Full<Bytes>),
    Streamed(mpsc::Receiver<Result<Bytes, StreamError>>),
}

impl From<Full<Bytes>> for ProxyBody {
    fn from(body: Full<Bytes>) -> Self {
        ProxyBody::Whole(body)
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        match self.get_mut() {
            ProxyBody::Whole(body) => Pin::new(body).poll_frame(cx).map_err(|never| match never {}),
            ProxyBody::Streamed(receiver) => receiver.poll_recv(cx).map(|next| next.map(|part| part.map(Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Whole(body) => body.is_end_stream(),
            ProxyBody::Streamed(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Whole(body) => body.size_hint(),
            ProxyBody::Streamed(_) => SizeHint::default(),
        }
    }
}
