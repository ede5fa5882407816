//! The HTTP side: request handling, the admin listener and the counters.

use crate::conditional::{self, Precondition};
use crate::deadlines::Deadlines;
use crate::files::{self, FileSet, PathRefusal};
use crate::{OriginConfig, OriginError, OriginStats};
use bytes::Bytes;
use hyper::header::{
    HeaderMap, HeaderValue, ACCEPT_RANGES, ALLOW, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, DATE, ETAG,
    LAST_MODIFIED,
};
use hyper::{Method, Request, Response, StatusCode};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};
use tierstack_base::time::system_now;
use tierstack_model::{Caching, Storage};
use tierstack_stats::exposition::Exposition;
use tierstack_tier_http::observe::{self, Observed};
use tierstack_tier_http::RequestBody;
use tierstack_tier_http::{text, Body};
use tokio::time::Instant;

/// Synthetic bodies up to this size are built on the runtime thread; larger
/// ones on the blocking pool, so a big body never stalls other connections.
const INLINE_BODY_BYTES_MAX: u64 = 1 << 20;

/// What one origin process shares between its connections.
pub(crate) struct State {
    files: Content,
    cache_control: Option<HeaderValue>,
    synthetic_last_modified: SystemTime,
    /// The cache and the disk queue. Held only for one decision, never
    /// across an await.
    storage: Mutex<Storage<String>>,
    /// The origin of the disk queue's clock (monotonic nanoseconds).
    started: Instant,
    /// Wakes a response at its read's modelled completion.
    deadlines: Deadlines,
    counters: Counters,
}

enum Content {
    /// The canonical root, so a resolved file can be checked to lie under it.
    Root(PathBuf),
    Synthetic(files::SyntheticSet),
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    not_modified: AtomicU64,
    bytes_sent: AtomicU64,
    responses: Mutex<BTreeMap<u16, u64>>,
}

/// One representation, as far as the headers need it.
struct Representation {
    /// The cache and disk key: the decoded request path.
    key: String,
    size: u64,
    etag: String,
    last_modified: SystemTime,
    content_type: &'static str,
    source: Source,
}

enum Source {
    File(PathBuf),
    Synthetic,
}

impl State {
    pub(crate) fn new(config: &OriginConfig) -> Result<State, OriginError> {
        let files = match &config.files {
            FileSet::Root(root) => {
                let canonical =
                    std::fs::canonicalize(root).map_err(|source| OriginError::Root { path: root.clone(), source })?;
                if !canonical.is_dir() {
                    return Err(OriginError::RootNotADirectory(root.clone()));
                }
                std::fs::read_dir(&canonical).map_err(|source| OriginError::Root { path: root.clone(), source })?;
                Content::Root(canonical)
            }
            FileSet::Synthetic(set) => Content::Synthetic(set.clone()),
        };
        let cache_control = match config.cache_control.as_deref() {
            None | Some("") => None,
            Some(value) => {
                Some(HeaderValue::from_str(value).map_err(|_| OriginError::BadCacheControl(value.to_string()))?)
            }
        };
        Ok(State {
            files,
            cache_control,
            synthetic_last_modified: conditional::whole_seconds(config.synthetic_last_modified),
            storage: Mutex::new(Storage::new(config.storage)),
            started: Instant::now(),
            deadlines: Deadlines::start(),
            counters: Counters::default(),
        })
    }

    pub(crate) fn stats(&self) -> OriginStats {
        let counts = self.storage.lock().unwrap_or_else(PoisonError::into_inner).counts();
        let responses = self.counters.responses.lock().unwrap_or_else(PoisonError::into_inner).clone();
        OriginStats {
            requests: self.counters.requests.load(Ordering::Relaxed),
            responses,
            not_modified: self.counters.not_modified.load(Ordering::Relaxed),
            cache_hits: counts.cache_hits,
            cache_misses: counts.cache_misses,
            disk_reads: counts.disk_reads,
            disk_bytes: counts.disk_bytes,
            disk_busy_ns: counts.disk_busy_ns,
            disk_wait_ns: counts.disk_wait_ns,
            bytes_sent: self.counters.bytes_sent.load(Ordering::Relaxed),
            cache_bytes: counts.cache_bytes,
            cache_objects: counts.cache_objects,
        }
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Waits until `ready_ns` on the storage's clock, if it is still ahead.
    /// Neither a deadline already passed (every hit on a settled object,
    /// every read without an emulated disk) nor one ahead (a disk read) goes
    /// to tokio's timer, which rounds every sleep up to its next 1 ms tick
    /// (see `deadlines`).
    async fn wait_until(&self, ready_ns: u64) {
        if ready_ns > self.now_ns() {
            self.deadlines.wait_until((self.started + Duration::from_nanos(ready_ns)).into_std()).await;
        }
    }

    /// Looks the decoded path up; `Err` is the response to send instead.
    async fn resolve(&self, decoded: &[u8]) -> Result<Representation, Response<Body>> {
        let not_found = || text(StatusCode::NOT_FOUND, "not found\n");
        match &self.files {
            Content::Synthetic(set) => {
                let key = std::str::from_utf8(decoded).map_err(|_| not_found())?;
                let size = set.size_of(key).ok_or_else(not_found)?;
                Ok(Representation {
                    key: key.to_string(),
                    size,
                    etag: conditional::synthetic_etag(key, size),
                    last_modified: self.synthetic_last_modified,
                    content_type: files::content_type(decoded),
                    source: Source::Synthetic,
                })
            }
            Content::Root(root) => {
                let candidate = root.join(files::relative_file_path(decoded));
                // Resolving symbolic links and checking the result lies under
                // the root keeps links from reaching outside it.
                let path = tokio::fs::canonicalize(&candidate).await.map_err(|_| not_found())?;
                if !path.starts_with(root) {
                    return Err(text(StatusCode::FORBIDDEN, "outside the served root\n"));
                }
                let metadata = tokio::fs::metadata(&path).await.map_err(|_| not_found())?;
                if !metadata.is_file() {
                    // No directory listings.
                    return Err(not_found());
                }
                if metadata.len() > files::OBJECT_BYTES_MAX {
                    return Err(text(StatusCode::INTERNAL_SERVER_ERROR, "file larger than this origin serves\n"));
                }
                let mtime = metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                let mtime_ns = mtime.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos();
                Ok(Representation {
                    key: String::from_utf8_lossy(decoded).into_owned(),
                    size: metadata.len(),
                    etag: conditional::file_etag(metadata.ino(), metadata.len(), mtime_ns),
                    // An origin never claims a modification after its own Date (RFC 9110 §8.8.2.1).
                    last_modified: mtime.min(system_now()),
                    content_type: files::content_type(decoded),
                    source: Source::File(path),
                })
            }
        }
    }

    fn validator_headers(&self, representation: &Representation, headers: &mut HeaderMap) {
        headers.insert(DATE, header(&httpdate::fmt_http_date(system_now())));
        if let Ok(etag) = HeaderValue::from_str(&representation.etag) {
            headers.insert(ETAG, etag);
        }
        headers.insert(LAST_MODIFIED, header(&httpdate::fmt_http_date(representation.last_modified)));
        if let Some(cache_control) = &self.cache_control {
            headers.insert(CACHE_CONTROL, cache_control.clone());
        }
    }

    async fn handle(&self, request: Request<RequestBody>) -> Response<Body> {
        let method = request.method();
        if method != Method::GET && method != Method::HEAD {
            let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
            response.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            return response;
        }
        let decoded = match files::decode_request_path(request.uri().path()) {
            Ok(decoded) => decoded,
            Err(PathRefusal::Traversal) => return text(StatusCode::BAD_REQUEST, "`..` is not served\n"),
            Err(PathRefusal::BadEscape | PathRefusal::Malformed) => {
                return text(StatusCode::BAD_REQUEST, "malformed request path\n")
            }
        };
        let representation = match self.resolve(&decoded).await {
            Ok(representation) => representation,
            Err(response) => return response,
        };
        let mut response = Response::new(Body::new(Bytes::new()));
        self.validator_headers(&representation, response.headers_mut());
        if conditional::evaluate(request.headers(), &representation.etag, representation.last_modified)
            == Precondition::NotModified
        {
            *response.status_mut() = StatusCode::NOT_MODIFIED;
            self.counters.not_modified.fetch_add(1, Ordering::Relaxed);
            return response;
        }
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(representation.content_type));
        // Range requests are answered with the whole representation (RFC
        // 9110 §14.2 allows ignoring Range), and this says so up front.
        headers.insert(ACCEPT_RANGES, HeaderValue::from_static("none"));
        if method == Method::HEAD {
            // HEAD reads metadata only: no cache lookup, no disk read.
            headers.insert(CONTENT_LENGTH, HeaderValue::from(representation.size));
            return response;
        }
        // Decide the read's cost at arrival (lookup, disk, insert), then
        // produce the bytes while the modelled read runs.
        let ready_ns = {
            let mut storage = self.storage.lock().unwrap_or_else(PoisonError::into_inner);
            let now_ns = self.now_ns();
            storage.read(now_ns, &representation.key, representation.size, Caching::Normal).ready_ns()
        };
        let body = match &representation.source {
            Source::Synthetic if representation.size <= INLINE_BODY_BYTES_MAX => {
                files::synthetic_body(&representation.key, representation.size)
            }
            Source::Synthetic => {
                let (key, size) = (representation.key.clone(), representation.size);
                match tokio::task::spawn_blocking(move || files::synthetic_body(&key, size)).await {
                    Ok(body) => body,
                    Err(e) => {
                        return text(StatusCode::INTERNAL_SERVER_ERROR, format!("building the body failed: {e}\n"))
                    }
                }
            }
            Source::File(path) => match tokio::fs::read(path).await {
                Ok(bytes) => Bytes::from(bytes),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "reading a served file failed");
                    return text(StatusCode::INTERNAL_SERVER_ERROR, "reading the file failed\n");
                }
            },
        };
        self.wait_until(ready_ns).await;
        self.counters.bytes_sent.fetch_add(body.len() as u64, Ordering::Relaxed);
        *response.body_mut() = Body::new(body);
        response
    }

    /// Serves one client request and counts it.
    pub(crate) async fn serve_client(self: Arc<Self>, request: Request<RequestBody>) -> Response<Body> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let response = self.handle(request).await;
        *self
            .counters
            .responses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(response.status().as_u16())
            .or_default() += 1;
        response
    }

    /// The admin listener: `GET /stats` (JSON), `/metrics`, `/healthz`, `/readyz`.
    pub(crate) async fn serve_admin(self: Arc<Self>, request: Request<RequestBody>) -> Response<Body> {
        if let Some(response) = observe::respond(&request, self.as_ref()) {
            return response;
        }
        if request.uri().path() != "/stats" {
            return text(
                StatusCode::NOT_FOUND,
                "the admin listener serves GET /stats, /metrics, /healthz and /readyz\n",
            );
        }
        if request.method() != Method::GET {
            let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
            response.headers_mut().insert(ALLOW, HeaderValue::from_static("GET"));
            return response;
        }
        match serde_json::to_vec(&self.stats()) {
            Ok(json) => {
                let mut response = Response::new(Body::new(Bytes::from(json)));
                response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                response
            }
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
        }
    }
}

/// Its files are opened (or synthesized) before it serves: alive is ready
/// (no readiness checks).
impl Observed for State {
    fn metrics(&self, out: &mut Exposition) {
        let stats = self.stats();
        let mut counter =
            |name: &str, help: &str, value: u64| out.counter(&format!("tierstack_origin_{name}"), help, value);
        counter("requests_total", "Client requests received.", stats.requests);
        counter("not_modified_total", "Conditional requests answered 304 Not Modified.", stats.not_modified);
        counter("cache_hits_total", "GETs whose object was in the memory cache.", stats.cache_hits);
        counter("cache_misses_total", "GETs whose object was not in the memory cache.", stats.cache_misses);
        counter("disk_reads_total", "Reads that went to the (emulated) disk.", stats.disk_reads);
        counter("disk_read_bytes_total", "Bytes read from the (emulated) disk.", stats.disk_bytes);
        counter("sent_bytes_total", "Response body bytes handed to client connections.", stats.bytes_sent);
        let codes: Vec<String> = stats.responses.keys().map(u16::to_string).collect();
        let samples: Vec<([(&str, &str); 1], u64)> =
            codes.iter().zip(stats.responses.values()).map(|(code, n)| ([("code", code.as_str())], *n)).collect();
        let samples: Vec<(&[(&str, &str)], u64)> = samples.iter().map(|(labels, n)| (&labels[..], *n)).collect();
        out.counters("tierstack_origin_responses_total", "Responses by status code.", &samples);
        let seconds = |ns: u64| ns as f64 / 1e9;
        out.counter_f64(
            "tierstack_origin_disk_busy_seconds_total",
            "Modelled service time of the disk reads, seconds.",
            seconds(stats.disk_busy_ns),
        );
        out.counter_f64(
            "tierstack_origin_disk_wait_seconds_total",
            "Time disk reads waited behind earlier ones, seconds.",
            seconds(stats.disk_wait_ns),
        );
        out.gauge("tierstack_origin_cache_bytes", "Bytes in the memory cache now.", stats.cache_bytes as f64);
        out.gauge("tierstack_origin_cache_objects", "Objects in the memory cache now.", stats.cache_objects as f64);
    }
}

/// A header value from text this crate formats (dates): always valid.
fn header(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}
