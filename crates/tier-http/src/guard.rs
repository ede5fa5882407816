//! Slow-client guards: what [`serve_with_options`](crate::serve_with_options)
//! keeps per connection so that no client can hold one longer than the
//! limits allow.
//!
//! - **Header timeout**: a connection waiting for a request head longer
//!   than the bound is closed (the watcher task in `lib.rs`).
//! - **Body deadline**: once a head has arrived, the server waits at most
//!   the body timeout, counted from the head, for the request's body. A
//!   deadline rather than a minimum rate: it bounds how long any client can
//!   hold a connection with one request (header timeout + body timeout),
//!   whatever it trickles, and needs no tuning of a rate that a slow but
//!   honest link might miss for a moment. [`GuardedIo`] enforces it where
//!   the bytes are awaited: a read still pending past the deadline while
//!   the body is unfinished fails, and hyper closes the connection. The
//!   handler's [`RequestBody`] says when the body is finished (read to its
//!   end, or dropped): hyper also keeps a read pending while a handler
//!   works after the body (to notice a client that leaves), and that wait
//!   must not count, so a slow handler is never cut by the deadline.
//! - **Write timeout**: a write that stays pending (the client does not
//!   take the response's bytes) longer than the bound fails and closes the
//!   connection; each write that makes progress starts the clock again.
//!   Progress rather than a whole-response deadline, so that a large answer
//!   to a slow but reading client is not cut; the kernel wakes a blocked
//!   writer only once a third of the send buffer is free, so a client must
//!   take tens of KiB per bound to stay.
//! - **When full** ([`Registry`]): at `max_connections`, a new connection
//!   takes the place of the connection that has waited on its client the
//!   longest (for a head, a body, or to take a response), which is closed.
//!   A connection whose handler is working is never chosen; if all are,
//!   the new one waits for a slot. So slow or idle clients can never lock
//!   a fresh one out, whatever their number: it is served at once, not
//!   after the others' timeouts (a FIFO backlog behind 10,000 slow clients
//!   would take ten rounds of timeouts with a limit of 1,000).
//! - **Per-client cap** ([`PerClient`]): optionally, at most N connections
//!   from one IP address; one more is closed at once.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// What one connection is doing, shared by its I/O, its service, its
/// watcher and the registry. Times are nanoseconds since `start`.
pub(crate) struct ConnState {
    start: Instant,
    /// Since when it waits for a request head, or [`NONE`] while a request
    /// is being answered.
    head_since_ns: AtomicU64,
    /// When the head of the request being answered arrived, while that
    /// request's body is unfinished (the body deadline counts from it),
    /// else [`NONE`].
    body_since_ns: AtomicU64,
    /// A read is pending: the server waits for the client's bytes.
    read_blocked: AtomicBool,
    /// Since when a write is pending (the client takes no bytes), or [`NONE`].
    write_blocked_since_ns: AtomicU64,
    /// Told when the registry closes this connection to make room.
    pub(crate) evict: tokio::sync::Notify,
    /// Chosen to make room already (never chosen twice).
    evicted: AtomicBool,
    /// HTTP/2: streams open; while any is, the connection waits for no head.
    streams: AtomicU32,
}

const NONE: u64 = u64::MAX;

impl ConnState {
    pub(crate) fn new() -> Self {
        ConnState {
            start: Instant::now(),
            head_since_ns: AtomicU64::new(0),
            body_since_ns: AtomicU64::new(NONE),
            read_blocked: AtomicBool::new(false),
            write_blocked_since_ns: AtomicU64::new(NONE),
            evict: tokio::sync::Notify::new(),
            evicted: AtomicBool::new(false),
            streams: AtomicU32::new(0),
        }
    }

    fn ns_since_start(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.start).as_nanos()).unwrap_or(NONE - 1)
    }

    fn at(&self, ns: u64) -> Option<Instant> {
        (ns != NONE).then(|| self.start + Duration::from_nanos(ns))
    }

    /// A request head arrived; `has_body` (and a body deadline to keep)
    /// reads the clock, a bodiless request does not.
    pub(crate) fn head_arrived(&self, has_body: bool) -> u64 {
        self.head_since_ns.store(NONE, Ordering::Relaxed);
        if !has_body {
            return NONE;
        }
        let since = self.ns_since_start(Instant::now());
        self.body_since_ns.store(since, Ordering::Relaxed);
        since
    }

    /// The response is done with: the connection waits for the next head.
    pub(crate) fn answered(&self) {
        self.body_since_ns.store(NONE, Ordering::Relaxed);
        self.head_since_ns.store(self.ns_since_start(Instant::now()), Ordering::Relaxed);
    }

    /// HTTP/2: a stream opened; the connection is busy.
    pub(crate) fn stream_opened(&self) {
        self.streams.fetch_add(1, Ordering::Relaxed);
        self.head_since_ns.store(NONE, Ordering::Relaxed);
    }

    /// HTTP/2: a stream is done with; the last one leaves the connection
    /// idle (waiting for a head, as HTTP/1.1 says it) from now.
    pub(crate) fn stream_closed(&self) {
        if self.streams.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.head_since_ns.store(self.ns_since_start(Instant::now()), Ordering::Relaxed);
        }
    }

    /// HTTP/2: how many streams are open.
    pub(crate) fn streams_open(&self) -> u32 {
        self.streams.load(Ordering::Relaxed)
    }

    /// Since when the connection waits for a head, if it does. (An HTTP/2
    /// stream opening as another closes may leave a mark behind; the
    /// count of open streams, read after it, says it is busy.)
    pub(crate) fn waiting_since(&self) -> Option<Instant> {
        let since = self.at(self.head_since_ns.load(Ordering::Relaxed))?;
        (self.streams.load(Ordering::Relaxed) == 0).then_some(since)
    }

    /// As [`ConnState::waiting_since`], but not while a write is pending:
    /// a response body is done with once hyper has taken its last frame,
    /// maybe long before the client has taken its bytes, and that wait
    /// belongs to the write timeout, not the header timeout.
    pub(crate) fn waiting_for_head_since(&self) -> Option<Instant> {
        if self.write_blocked_since_ns.load(Ordering::Relaxed) != NONE {
            return None;
        }
        self.waiting_since()
    }

    /// Since when the connection has waited on its client (for a head, for
    /// a body, or to take a response), or `None` while its handler works.
    pub(crate) fn stalled_since(&self) -> Option<Instant> {
        if let Some(since) = self.at(self.write_blocked_since_ns.load(Ordering::Relaxed)) {
            return Some(since);
        }
        if let Some(since) = self.waiting_since() {
            return Some(since);
        }
        if self.read_blocked.load(Ordering::Relaxed) {
            return self.at(self.body_since_ns.load(Ordering::Relaxed));
        }
        None
    }
}

/// A request's body as a tier's handler receives it: hyper's, which tells
/// its connection when it is finished (read to its end, or dropped), so
/// that the body deadline stops counting then. On HTTP/2 the deadline is
/// the stream's own: a read still pending past it fails (the connection's
/// other streams go on).
pub struct RequestBody {
    inner: hyper::body::Incoming,
    /// The connection and its head's arrival ([`ConnState::head_arrived`]),
    /// while this body is unfinished and under a deadline.
    unfinished: Option<(Arc<ConnState>, u64)>,
    /// HTTP/2: the stream's body deadline (boxed: a plain HTTP/1.1
    /// request's body, moved with every request, grows by a pointer only).
    deadline: Option<Pin<Box<Sleep>>>,
}

/// Why a request body could not be read: hyper's error, or (HTTP/2) the
/// stream's body deadline passed.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

impl RequestBody {
    pub(crate) fn new(inner: hyper::body::Incoming, unfinished: Option<(Arc<ConnState>, u64)>) -> Self {
        RequestBody { inner, unfinished, deadline: None }
    }

    pub(crate) fn with_deadline(inner: hyper::body::Incoming, deadline: Option<Instant>) -> Self {
        RequestBody { inner, unfinished: None, deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))) }
    }

    fn finished(&mut self) {
        if let Some((state, since)) = self.unfinished.take() {
            // Only this request's mark: a body kept past its answer must
            // not clear the next request's.
            let _ = state.body_since_ns.compare_exchange(since, NONE, Ordering::Relaxed, Ordering::Relaxed);
        }
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        self.finished();
    }
}

impl hyper::body::Body for RequestBody {
    type Data = bytes::Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if polled.is_pending() {
            if let Some(timer) = &mut self.deadline {
                if timer.as_mut().poll(cx).is_ready() {
                    self.deadline = None;
                    return Poll::Ready(Some(Err(timed_out(
                        "the request body did not arrive within the body timeout",
                    )
                    .into())));
                }
            }
            return Poll::Pending;
        }
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) || self.inner.is_end_stream() {
            self.finished();
            self.deadline = None;
        }
        polled.map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's socket with the body deadline and the write timeout
/// enforced on it (hyper has neither): a read pending past the body
/// deadline, or a write pending longer than the write timeout, fails with
/// `TimedOut`. The timers are armed only on those slow paths.
pub(crate) struct GuardedIo<S> {
    inner: S,
    state: Arc<ConnState>,
    body_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
    read_timer: Option<Pin<Box<Sleep>>>,
    write_timer: Option<Pin<Box<Sleep>>>,
    write_blocked: bool,
}

impl<S> GuardedIo<S> {
    pub(crate) fn new(
        inner: S,
        state: Arc<ConnState>,
        body_timeout: Option<Duration>,
        write_timeout: Option<Duration>,
    ) -> Self {
        GuardedIo {
            inner,
            state,
            body_timeout,
            write_timeout,
            read_timer: None,
            write_timer: None,
            write_blocked: false,
        }
    }

    /// On a pending read: fails once the body deadline has passed.
    fn body_deadline_passed(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(timeout) = self.body_timeout else { return false };
        let Some(since) = self.state.at(self.state.body_since_ns.load(Ordering::Relaxed)) else { return false };
        poll_timer(&mut self.read_timer, since + timeout, cx)
    }

    fn write_progressed(&mut self) {
        if self.write_blocked {
            self.write_blocked = false;
            self.state.write_blocked_since_ns.store(NONE, Ordering::Relaxed);
        }
    }

    /// On a pending write: fails once it has been pending the write timeout.
    fn write_stalled_too_long(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.write_blocked {
            self.write_blocked = true;
            self.state.write_blocked_since_ns.store(self.state.ns_since_start(Instant::now()), Ordering::Relaxed);
        }
        let Some(timeout) = self.write_timeout else { return false };
        let Some(since) = self.state.at(self.state.write_blocked_since_ns.load(Ordering::Relaxed)) else {
            return false;
        };
        poll_timer(&mut self.write_timer, since + timeout, cx)
    }

    /// What a write (plain or vectored) of the inner stream came to, under
    /// the write timeout: progress is noted, a stall past it fails.
    fn guard_write(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match polled {
            Poll::Ready(result) => {
                self.write_progressed();
                Poll::Ready(result)
            }
            Poll::Pending if self.write_stalled_too_long(cx) => {
                Poll::Ready(Err(timed_out("the client took no response bytes within the write timeout")))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Polls a timer set to `deadline` (made on first use, moved when the
/// deadline moved); true once it has passed.
fn poll_timer(timer: &mut Option<Pin<Box<Sleep>>>, deadline: Instant, cx: &mut Context<'_>) -> bool {
    let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
    if timer.deadline() != deadline {
        timer.as_mut().reset(deadline);
    }
    timer.as_mut().poll(cx).is_ready()
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what.to_string())
}

impl<S: AsyncRead + Unpin> AsyncRead for GuardedIo<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                self.state.read_blocked.store(false, Ordering::Relaxed);
                Poll::Ready(result)
            }
            Poll::Pending => {
                self.state.read_blocked.store(true, Ordering::Relaxed);
                if self.body_deadline_passed(cx) {
                    return Poll::Ready(Err(timed_out("the request body did not arrive within the body timeout")));
                }
                Poll::Pending
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for GuardedIo<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.guard_write(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.guard_write(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The open connections of a listener with a connection limit, so that a
/// new one can take the place of the one stalled longest.
#[derive(Default)]
pub(crate) struct Registry {
    open: Mutex<HashMap<u64, Arc<ConnState>>>,
    next_id: AtomicU64,
}

impl Registry {
    /// Adds a connection; it leaves when the guard is dropped.
    pub(crate) fn enter(self: &Arc<Self>, state: Arc<ConnState>) -> Registered {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.open.lock().unwrap_or_else(|e| e.into_inner()).insert(id, state);
        Registered { registry: self.clone(), id }
    }

    /// Closes the connection that has waited on its client the longest;
    /// false if every one is being answered by its handler.
    pub(crate) fn evict_longest_stalled(&self) -> bool {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let oldest = open
            .values()
            .filter(|state| !state.evicted.load(Ordering::Relaxed))
            .filter_map(|state| state.stalled_since().map(|since| (since, state)))
            .min_by_key(|(since, _)| *since);
        match oldest {
            Some((_, state)) => {
                state.evicted.store(true, Ordering::Relaxed);
                state.evict.notify_one();
                true
            }
            None => false,
        }
    }
}

/// A connection's place in the [`Registry`], given up on drop.
pub(crate) struct Registered {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.open.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
    }
}

/// Open connections per client address, for
/// [`ServeOptions::max_connections_per_client`](crate::ServeOptions::max_connections_per_client).
pub(crate) struct PerClient {
    max: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl PerClient {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(PerClient { max, open: Mutex::new(HashMap::new()) })
    }

    /// A place for one more connection from `ip`, or `None` at the cap.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<ClientSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(ip).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(ClientSlot { per_client: self.clone(), ip })
    }
}

/// One connection's place under its address's cap, given up on drop.
pub(crate) struct ClientSlot {
    per_client: Arc<PerClient>,
    ip: IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.per_client.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_client_cap_counts_each_address_and_frees_on_drop() {
        let per_client = PerClient::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = per_client.admit(a).unwrap();
        let _second = per_client.admit(a).unwrap();
        assert!(per_client.admit(a).is_none(), "a third connection from one address is refused");
        assert!(per_client.admit(b).is_some(), "another address has its own count");
        drop(first);
        assert!(per_client.admit(a).is_some(), "a closed connection frees its place");
    }

    #[test]
    fn eviction_picks_the_longest_stalled_and_never_a_working_one() {
        let registry = Arc::new(Registry::default());
        let working = Arc::new(ConnState::new());
        working.head_arrived(false);
        let _w = registry.enter(working.clone());
        assert!(!registry.evict_longest_stalled(), "a connection whose handler works is never evicted");
        let older = Arc::new(ConnState::new());
        let _o = registry.enter(older.clone());
        let newer = Arc::new(ConnState::new());
        newer.head_since_ns.store(1_000_000, Ordering::Relaxed);
        let _n = registry.enter(newer.clone());
        assert!(registry.evict_longest_stalled());
        let notified = older.evict.notified();
        tokio::pin!(notified);
        assert!(futures_ready(notified.as_mut()), "the older idle connection was told");
        let notified = newer.evict.notified();
        tokio::pin!(notified);
        assert!(!futures_ready(notified.as_mut()), "the newer one was not");
    }

    /// Whether `future` is ready on its first poll.
    fn futures_ready<F: Future>(future: Pin<&mut F>) -> bool {
        let waker = std::task::Waker::noop();
        future.poll(&mut Context::from_waker(waker)).is_ready()
    }
}
