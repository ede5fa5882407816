//! Misses and revalidations upstream: sending a request to the routed
//! upstream (retrying elsewhere, or once more when fenced), reading a
//! response whole ([`fetch`]), and relaying a miss to the client while
//! teeing it into the cache ([`forward`]).

use crate::headers::{copy_end_to_end, is_unsafe, target_of, upstream_fields, X_CACHE_NAME};
use crate::route::Routed;
use crate::state::State;
use crate::stats::elapsed_ns;
use crate::store::{invalidate, store, Stored};
use crate::stream::{self, ProxyBody};
use crate::upstream::{PooledBody, UpstreamError};
use crate::{coalesce, coop, policy, CacheMode};
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderMap, HeaderValue, RANGE};
use hyper::{Method, Request, Response, StatusCode, Uri};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tierstack_monitor::reconfig::ROLE_HEADER;
use tierstack_tier_http::{collect_limited, text, Body};

/// Largest request body forwarded.
pub const REQUEST_BODY_BYTES_MAX: usize = 16 << 20;
/// A miss whose declared length is at most this is read whole, then
/// answered as one response; longer or unknown lengths stream.
pub const WHOLE_BYTES_MAX: usize = 256 << 10;
/// Largest response body read whole (revalidations, pushes).
pub const RESPONSE_BODY_BYTES_MAX: usize = 64 << 20;

/// Tries of a forward whose upstream fences it (421) before the 421 is
/// the answer.
const FENCED_ATTEMPTS_MAX: u32 = 2;

/// An upstream response, its body read, and when it was asked for and
/// received (seconds since the epoch, for its age).
pub(crate) struct Fetched {
    pub(crate) parts: hyper::http::response::Parts,
    pub(crate) body: Bytes,
    pub(crate) request_time: u64,
    pub(crate) response_time: u64,
}

impl Fetched {
    /// The response to the client: status, end-to-end fields, body.
    pub(crate) fn into_response(self) -> Response<Body> {
        let mut response = Response::new(Full::new(self.body));
        *response.status_mut() = self.parts.status;
        copy_end_to_end(&self.parts.headers, response.headers_mut());
        response.headers_mut().insert(X_CACHE_NAME, HeaderValue::from_static("MISS"));
        response
    }
}

/// Sends `method target` with `headers` (end-to-end already) and `body` to
/// the upstream chosen for `target`; the response read whole, or the
/// error response to give the client (502 unreachable, 504 too slow, 503
/// refused).
pub(crate) async fn fetch(
    state: &State,
    method: &Method,
    target: &str,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Fetched, Response<Body>> {
    // `_routed` lives until the body is read.
    let (response, started, request_time, _routed) = send(state, method, target, headers, body).await?;
    let upstream_error = |response: Response<Body>| {
        state.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
        response
    };
    let (parts, body) = response.into_parts();
    let body = match tokio::time::timeout(state.upstream_timeout, collect_limited(body, RESPONSE_BODY_BYTES_MAX)).await
    {
        Ok(Ok(body)) => body,
        Ok(Err(e)) => {
            return Err(upstream_error(text(StatusCode::BAD_GATEWAY, format!("application server response: {e}\n"))))
        }
        Err(_) => {
            return Err(upstream_error(text(StatusCode::GATEWAY_TIMEOUT, "application server response timed out\n")))
        }
    };
    state.counters.upstream_ns.fetch_add(elapsed_ns(started), Ordering::Relaxed);
    state.counters.upstream_bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
    Ok(Fetched { parts, body, request_time, response_time: policy::now_secs() })
}

/// Sends the request upstream and waits for the response's head (the
/// body still to read); also when it was sent (for its time and age), and
/// the upstream it went to: the caller holds that until the body is read,
/// so the balancer counts the forward in flight until then.
async fn send<'a>(
    state: &'a State,
    method: &Method,
    target: &str,
    mut headers: HeaderMap,
    body: Bytes,
) -> Result<(Response<PooledBody>, Instant, u64, Routed<'a>), Response<Body>> {
    let mut attempt = 0;
    // Upstreams that failed this request (as nginx's `proxy_next_upstream
    // error timeout`): each is tried at most once.
    let mut tried: Vec<usize> = Vec::new();
    let request_time = policy::now_secs();
    let idempotent = is_idempotent(method);
    let (started, response, routed) = loop {
        attempt += 1;
        let routed = state.route(target, &tried).await?;
        let Some(uri) = upstream_uri(&state.upstreams[routed.index], target) else {
            return Err(text(StatusCode::BAD_REQUEST, "unusable request target\n"));
        };
        let another_left = tried.len() + 1 < state.upstreams.len();
        // The fields are copied only if this attempt may be followed by
        // another (another upstream, or a fenced request routed again);
        // else the last attempt takes them.
        let may_repeat = another_left || (routed.stamp.is_some() && attempt < FENCED_ATTEMPTS_MAX);
        let fields = if may_repeat { headers.clone() } else { std::mem::take(&mut headers) };
        let mut upstream_request = Request::new(Full::new(body.clone()));
        *upstream_request.method_mut() = method.clone();
        *upstream_request.uri_mut() = uri;
        *upstream_request.headers_mut() = fields;
        if let Some(stamp) = routed.stamp {
            if let Ok(value) = HeaderValue::from_str(&stamp.to_header()) {
                upstream_request.headers_mut().insert(ROLE_HEADER, value);
            }
        }
        let started = tierstack_base::time::instant_now();
        // Only a request that may be repeated elsewhere is given up while
        // its upstream is merely unresponsive.
        let may_abandon = idempotent && another_left;
        let answer = state.connections.request(routed.index, upstream_request);
        let outcome = wait_for_head(state, routed.index, may_abandon, answer).await;
        let retry = match &outcome {
            Waited::Answered(Ok(_)) => {
                state.failures.succeeded(routed.index);
                false
            }
            Waited::Answered(Err(e)) => {
                note_failure(state, routed.index);
                may_retry_elsewhere(e, method) && another_left
            }
            Waited::TimedOut => {
                note_failure(state, routed.index);
                state.counters.upstream_timeouts.fetch_add(1, Ordering::Relaxed);
                idempotent && another_left
            }
            Waited::Abandoned => {
                note_failure(state, routed.index);
                state.counters.upstream_abandoned.fetch_add(1, Ordering::Relaxed);
                true // only a request that may go elsewhere is abandoned
            }
        };
        if retry {
            state.counters.upstream_retries.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(upstream = routed.index, "upstream failed the forward; trying another");
            tried.push(routed.index);
            continue;
        }
        // The upstream moved to another site after we read its role (the
        // epoch fence refused the request): route it once more.
        if let Waited::Answered(Ok(response)) = &outcome {
            if response.status() == StatusCode::MISDIRECTED_REQUEST && routed.stamp.is_some() {
                state.counters.fenced.fetch_add(1, Ordering::Relaxed);
                if attempt < FENCED_ATTEMPTS_MAX {
                    continue;
                }
            }
        }
        break (started, outcome, routed);
    };
    let upstream_error = |response: Response<Body>| {
        state.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
        response
    };
    let response = match response {
        Waited::Answered(Ok(response)) => response,
        Waited::Answered(Err(e)) => {
            return Err(upstream_error(text(StatusCode::BAD_GATEWAY, format!("application server unreachable: {e}\n"))))
        }
        Waited::TimedOut | Waited::Abandoned => {
            return Err(upstream_error(text(
                StatusCode::GATEWAY_TIMEOUT,
                "application server did not answer in time\n",
            )))
        }
    };
    Ok((response, started, request_time, routed))
}

/// The origin-form URI of `target` (a path and query) at `upstream`: the
/// upstream's path without a trailing `/`, then the target. `None` if that
/// is no URI.
pub(crate) fn upstream_uri(upstream: &Uri, target: &str) -> Option<Uri> {
    let prefix = upstream.path().trim_end_matches('/');
    if prefix.is_empty() && target.starts_with('/') {
        // The common case: no prefix to keep, so no string to format.
        return target.parse().ok();
    }
    let uri: Uri = format!("{prefix}{target}").parse().ok()?;
    // Only a path and query: anything else would be sent as it is.
    (uri.scheme().is_none() && uri.authority().is_none() && uri.path().starts_with('/')).then_some(uri)
}

/// How waiting for an upstream's response head ended.
enum Waited<T> {
    Answered(T),
    /// No head within `upstream_timeout`.
    TimedOut,
    /// Given up early: the upstream's load source says it is suspect
    /// (stopped, wedged) or dead.
    Abandoned,
}

/// Waits for `answer` (the upstream's response head) up to the upstream
/// timeout. With a load source and `may_abandon`, every `suspect_probe`
/// without a head it asks whether the upstream still runs, and gives up
/// as soon as it is suspect or dead: a hung upstream then costs a forward
/// about one probe period past the suspicion bound, not the whole timeout.
async fn wait_for_head<F: std::future::Future>(
    state: &State,
    index: usize,
    may_abandon: bool,
    answer: F,
) -> Waited<F::Output> {
    let deadline = tokio::time::Instant::now() + state.upstream_timeout;
    let probe =
        state.suspect_probe.filter(|_| may_abandon && state.balancing.get().is_some_and(|b| b.source.is_some()));
    let Some(probe) = probe else {
        return match tokio::time::timeout_at(deadline, answer).await {
            Ok(output) => Waited::Answered(output),
            Err(_) => Waited::TimedOut,
        };
    };
    tokio::pin!(answer);
    loop {
        let wake = (tokio::time::Instant::now() + probe).min(deadline);
        match tokio::time::timeout_at(wake, &mut answer).await {
            Ok(output) => return Waited::Answered(output),
            Err(_) if tokio::time::Instant::now() >= deadline => return Waited::TimedOut,
            Err(_) => {
                if state.upstream_unresponsive(index).await == Some(true) {
                    return Waited::Abandoned;
                }
            }
        }
    }
}

/// Counts a failed forward to `index` (and the pause it may cause).
fn note_failure(state: &State, index: usize) {
    if state.failures.failed(index) {
        state.counters.upstream_pauses.fetch_add(1, Ordering::Relaxed);
        tracing::info!(upstream = index, "upstream paused after failed forwards");
    }
}

/// RFC 9110 §9.2.2: a request that may be repeated with the same effect.
fn is_idempotent(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS | Method::TRACE)
}

/// May a request that failed with `error` go to another upstream? If the
/// connection was never made (refused, unreachable): the request was not
/// sent, so any method. If the exchange failed before a whole response head
/// arrived (the connection closed or reset, the head unreadable): only an
/// idempotent method (RFC 9110 §9.2.2), which may have been processed but
/// may be repeated.
fn may_retry_elsewhere(error: &UpstreamError, method: &Method) -> bool {
    if error.is_connect() {
        return true;
    }
    is_idempotent(method) && error.is_failure_before_head()
}

/// Forwards to the upstream and streams the answer back as it arrives. A
/// GET's answer no larger than the cache's per-object limit is teed into a
/// buffer and, once whole, stored if it may be (the flight's `leader`, if
/// any, then hands it to its waiters); a larger one streams through
/// uncached. An unsafe method's success invalidates (§4.4).
pub(crate) async fn forward<B>(
    state: &Arc<State>,
    request: Request<B>,
    key: &str,
    leader: Option<coalesce::Leader>,
) -> Response<ProxyBody>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = request.into_parts();
    let body = match collect_limited(body, REQUEST_BODY_BYTES_MAX).await {
        Ok(body) => body,
        Err(e) => return text(StatusCode::PAYLOAD_TOO_LARGE, format!("request body: {e}\n")).map(Into::into),
    };
    let (response, started, request_time, routed) =
        match send(state, &parts.method, target_of(key), upstream_fields(&parts.headers), body).await {
            Ok(sent) => sent,
            Err(response) => return response.map(Into::into),
        };
    let (head, mut upstream_body) = response.into_parts();
    let response_time = policy::now_secs();
    if is_unsafe(&parts.method) && (head.status.is_success() || head.status.is_redirection()) {
        invalidate(state, key, &head.headers);
    }
    let declared = head
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let object_max = state.object_bytes_max;
    // The pool takes what the proxy's own cache may not (`--cache-bytes 0`).
    let object_max = object_max.max(state.coop.get().map_or(0, |_| coop::OBJECT_BYTES_MAX));
    let mut tee = (parts.method == Method::GET
        && state.mode != CacheMode::NoCache
        && !parts.headers.contains_key(RANGE)
        && declared.is_none_or(|length| length <= object_max))
    .then(bytes::BytesMut::new);
    let mut response = Response::new(ProxyBody::Whole(Body::default()));
    *response.status_mut() = head.status;
    // The end-to-end fields, filtered once: the client's response takes
    // them (and `X-Cache`, room reserved), a stored copy is a clone.
    let mut fields = HeaderMap::with_capacity(head.headers.len() + 1);
    copy_end_to_end(&head.headers, &mut fields);
    let stored_fields = tee.is_some().then(|| fields.clone());
    fields.insert(X_CACHE_NAME, HeaderValue::from_static("MISS"));
    *response.headers_mut() = fields;
    // A body of a declared length up to WHOLE_BYTES_MAX, or whole in its
    // first frame, is answered at once, as one response, without a
    // relaying task: relaying many small frames costs more than it saves.
    let deadline = tokio::time::Instant::now() + state.upstream_timeout;
    let small = declared.is_some_and(|length| length <= WHOLE_BYTES_MAX);
    let first = if small {
        match tokio::time::timeout_at(deadline, collect_limited(&mut upstream_body, WHOLE_BYTES_MAX)).await {
            Ok(Ok(body)) => Some(body),
            Ok(Err(e)) => {
                state.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::BAD_GATEWAY, format!("application server response: {e}\n")).map(Into::into);
            }
            Err(_) => {
                state.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::GATEWAY_TIMEOUT, "application server response timed out\n").map(Into::into);
            }
        }
    } else {
        use http_body_util::BodyExt;
        match tokio::time::timeout_at(deadline, upstream_body.frame()).await {
            Ok(Some(Ok(frame))) => Some(frame.into_data().unwrap_or_default()),
            Ok(None) => None,
            Ok(Some(Err(e))) => {
                state.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::BAD_GATEWAY, format!("application server response: {e}\n")).map(Into::into);
            }
            Err(_) => {
                state.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::GATEWAY_TIMEOUT, "application server response timed out\n").map(Into::into);
            }
        }
    };
    if small || first.is_none() || hyper::body::Body::is_end_stream(&upstream_body) {
        let body = first.unwrap_or_default();
        let storable = tee.is_some() && body.len() <= object_max;
        let finish = Finish {
            state: state.clone(),
            key: key.to_string(),
            status: head.status,
            headers: stored_fields.unwrap_or_default(),
            request_headers: storable.then_some(parts.headers),
            leader,
            request_time,
            response_time,
            started,
        };
        let received = body.len() as u64;
        finish.store(storable.then(|| body.clone()), received);
        *response.body_mut() = ProxyBody::Whole(Full::new(body));
        return response;
    }
    // The balancer counts this forward in flight until its body is relayed.
    let in_flight = routed.detach(state);
    let (sender, receiver) = tokio::sync::mpsc::channel(stream::STREAM_FRAMES);
    *response.body_mut() = ProxyBody::Streamed(receiver);
    let (state, key, request_headers) = (state.clone(), key.to_string(), tee.as_ref().map(|_| parts.headers));
    let mut finish = Some(Finish {
        state,
        key,
        status: head.status,
        headers: stored_fields.unwrap_or_default(),
        request_headers,
        leader,
        request_time,
        response_time,
        started,
    });
    tokio::spawn(async move {
        use http_body_util::BodyExt;
        let _in_flight = in_flight;
        let Some(state) = finish.as_ref().map(|f| f.state.clone()) else { return };
        let mut received = 0u64;
        let mut pending = first;
        loop {
            let frame = match pending.take() {
                Some(data) => Ok(Some(Ok(hyper::body::Frame::data(data)))),
                None => tokio::time::timeout_at(deadline, upstream_body.frame()).await,
            };
            let frame = match frame {
                Ok(Some(Ok(frame))) => frame,
                Ok(None) => {
                    if let Some(finish) = finish.take() {
                        finish.store(tee.take().map(bytes::BytesMut::freeze), received);
                    }
                    return;
                }
                Ok(Some(Err(e))) => {
                    state.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
                    let _ = sender.send(Err(stream::StreamError(e.to_string()))).await;
                    return;
                }
                Err(_) => {
                    state.counters.upstream_errors.fetch_add(1, Ordering::Relaxed);
                    let _ = sender.send(Err(stream::StreamError("timed out".into()))).await;
                    return;
                }
            };
            let Ok(data) = frame.into_data() else { continue };
            received += data.len() as u64;
            if let Some(buffer) = &mut tee {
                if buffer.len() + data.len() > object_max {
                    // Larger than any object the cache takes: through only.
                    tee = None;
                } else {
                    buffer.extend_from_slice(&data);
                }
            }
            // The last part: stored before the client has it all, so its
            // next request finds it.
            if hyper::body::Body::is_end_stream(&upstream_body) {
                if let Some(finish) = finish.take() {
                    finish.store(tee.take().map(bytes::BytesMut::freeze), received);
                }
            }
            if sender.send(Ok(data)).await.is_err() {
                // The client went away: so does this fetch (and its flight).
                return;
            }
        }
    });
    response
}

/// What a streamed miss does once its body is whole.
struct Finish {
    state: Arc<State>,
    key: String,
    status: StatusCode,
    /// The response's end-to-end fields (empty if it is not to be stored).
    headers: HeaderMap,
    /// The client's request fields, if the answer may be stored.
    request_headers: Option<HeaderMap>,
    leader: Option<coalesce::Leader>,
    request_time: u64,
    response_time: u64,
    started: Instant,
}

impl Finish {
    /// Counts the fetch and stores the whole body (if kept); ends the flight.
    fn store(self, body: Option<Bytes>, received: u64) {
        let state = &self.state;
        state.counters.upstream_ns.fetch_add(elapsed_ns(self.started), Ordering::Relaxed);
        state.counters.upstream_bytes.fetch_add(received, Ordering::Relaxed);
        let (Some(body), Some(request_headers)) = (body, self.request_headers) else { return };
        let response = Stored {
            status: self.status,
            headers: self.headers,
            body,
            request_time: self.request_time,
            response_time: self.response_time,
        };
        let stored = store(state, &self.key, &request_headers, response);
        if let Some(leader) = self.leader {
            leader.finish(stored);
        }
    }
}
