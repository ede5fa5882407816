//! `tierstack origin`: a static web server whose misses cost what a disk costs.
//!
//! The cooperative-caching and PRESS experiments need an origin of static
//! files of given sizes, where a read that the node's memory does not hold
//! pays a disk, even on a machine whose files all sit in the page cache.
//! This crate is that origin:
//!
//! - **Content** ([`FileSet`]): real files under a root (percent-decoded
//!   paths, `..` refused in every spelling, symbolic links out of the root
//!   refused, no directory listings), or a [`SyntheticSet`] of paths and
//!   sizes whose bodies ([`synthetic_body`]) are generated per request, so
//!   a 400 MB set never sits in memory. A synthetic body starts with a line
//!   naming its path and size.
//! - **Validators**: `Last-Modified` (the file's mtime; for a synthetic set a
//!   configured date), a strong `ETag` (inode, size and mtime; or path and
//!   size), `Cache-Control`, `Content-Type` by extension. If-None-Match (weak
//!   comparison, `*`) and If-Modified-Since give 304 (RFC 9110 §13.2.2;
//!   If-None-Match decides alone when present). `Range` is ignored: the
//!   answer is the whole representation with `Accept-Ranges: none`.
//! - **Cost** ([`Storage`], pure, from `tierstack_model`, the same code the
//!   simulator's nodes run): a byte-bounded LRU memory cache
//!   (`tierstack_model::ByteLru`) in front of a FIFO emulated disk
//!   (`tierstack_model::DiskQueue`, service = seek + size / bandwidth). Each
//!   GET that sends a body decides, at its arrival and under one lock:
//!   lookup (touch), on a miss a disk read, then insert. The response leaves
//!   when the modelled read completes, at once if that time has passed, else
//!   woken by a deadline thread to well under a millisecond (tokio's timer
//!   would round every wait up to its next 1 ms tick; no runtime thread
//!   blocks), so N concurrent misses take N service times. HEAD and
//!   304 answers read metadata only and touch neither cache nor disk. The
//!   cache decides the cost only; bodies are always generated or read anew.
//! - **Counters** ([`OriginStats`]) on an optional admin listener, `GET /stats`,
//!   and as Prometheus text at `/metrics` beside it.
//!
//! The crate knows nothing of traces: the binary turns a trace's documents
//! into a [`SyntheticSet`].

mod args;
mod conditional;
mod deadlines;
mod files;
mod server;

pub use args::{OriginArgs, ORIGIN_THREADS_DEFAULT};
pub use conditional::{evaluate, file_etag, list_matches, synthetic_etag, Precondition};
pub use files::{
    content_type, decode_request_path, percent_decode, synthetic_body, synthetic_prefix, FileSet, PathRefusal,
    SyntheticSet, OBJECT_BYTES_MAX,
};
/// The cost model (`tierstack_model`'s storage, which the simulator's nodes
/// hold too), re-exported as part of this crate's API.
pub use tierstack_model::{Caching, DiskModel, ReadOutcome, Storage, StorageConfig, StorageCounts};

use serde::{Deserialize, Serialize};
use server::State;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tierstack_tier_http::{serve_with_options, ServeOptions, Stop};
use tokio::net::TcpListener;

/// The default `Cache-Control`. The content does not change during a run,
/// so caches may keep it; an hour outlasts any experiment, so a proxy's hit
/// rate is set by its capacity, not by expiry (what the seeds' experiments
/// measure), while someone editing a real root sees the change within the
/// hour, and the validators make revalidation a cheap 304.
pub const CACHE_CONTROL_DEFAULT: &str = "public, max-age=3600";

/// The default `Last-Modified` of synthetic objects: a fixed date
/// (2000-01-01T00:00:00Z), so two origins serving the same set, or one
/// origin restarted, agree on the validators and a cache's copy stays valid.
pub fn synthetic_last_modified_default() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(946_684_800)
}

/// Parses an HTTP-date (RFC 9110 §5.6.7, any of its three formats).
pub fn parse_http_date(text: &str) -> Option<SystemTime> {
    httpdate::parse_http_date(text.trim()).ok()
}

/// Errors starting an origin.
#[derive(Debug, thiserror::Error)]
pub enum OriginError {
    #[error("cannot serve root {path}: {source}")]
    Root { path: PathBuf, source: std::io::Error },
    #[error("cannot serve root {0}: not a directory")]
    RootNotADirectory(PathBuf),
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("in {path}: {source}")]
    InFile { path: PathBuf, source: Box<OriginError> },
    #[error("file list line {line} ({text:?}): {reason}")]
    FileList { line: usize, text: String, reason: String },
    #[error("object {index} ({path:?}): {reason}")]
    BadObject { index: usize, path: String, reason: String },
    #[error("object {path} of {size} bytes is larger than the {max} bytes an origin serves")]
    ObjectTooLarge { path: String, size: u64, max: u64 },
    #[error("invalid Cache-Control value {0:?}")]
    BadCacheControl(String),
    #[error("binding {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

/// How an origin is set up.
#[derive(Clone, Debug)]
pub struct OriginConfig {
    pub listen: SocketAddr,
    /// Where `GET /stats` is served; `None`: nowhere.
    pub admin_listen: Option<SocketAddr>,
    pub files: FileSet,
    /// The `Cache-Control` value; `None` or empty: no header.
    pub cache_control: Option<String>,
    /// `Last-Modified` of synthetic objects (cut to whole seconds).
    pub synthetic_last_modified: SystemTime,
    /// The memory cache and the emulated disk.
    pub storage: StorageConfig,
    /// The listeners' client limits (slow clients, connections).
    pub limits: ServeOptions,
}

impl OriginConfig {
    /// Defaults: no admin listener, [`CACHE_CONTROL_DEFAULT`], the fixed
    /// synthetic date, no memory cache, no emulated disk.
    pub fn new(listen: SocketAddr, files: FileSet) -> Self {
        Self {
            listen,
            admin_listen: None,
            files,
            cache_control: Some(CACHE_CONTROL_DEFAULT.to_string()),
            synthetic_last_modified: synthetic_last_modified_default(),
            storage: StorageConfig { cache_bytes: 0, cache_max_object_bytes: None, disk: None },
            limits: tierstack_tier_http::HttpLimitsArgs::default().serve_options(),
        }
    }
}

/// The origin's counters, served as JSON by `GET /stats`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OriginStats {
    /// Client requests received.
    pub requests: u64,
    /// Responses by status code.
    pub responses: BTreeMap<u16, u64>,
    /// 304 answers to conditional requests.
    pub not_modified: u64,
    /// GETs whose object was in the memory cache.
    pub cache_hits: u64,
    /// GETs whose object was not (with no cache: every GET that sent a body).
    pub cache_misses: u64,
    /// Reads that went to the (emulated) disk, and their bytes.
    pub disk_reads: u64,
    pub disk_bytes: u64,
    /// Total modelled service time of the disk reads (0 without a disk).
    pub disk_busy_ns: u64,
    /// Total time disk reads waited behind earlier ones.
    pub disk_wait_ns: u64,
    /// Body bytes handed to client connections.
    pub bytes_sent: u64,
    /// The memory cache's contents now.
    pub cache_bytes: u64,
    pub cache_objects: u64,
}

/// Reads an origin's counters while it runs and after.
#[derive(Clone)]
pub struct StatsReader(Arc<State>);

impl StatsReader {
    pub fn snapshot(&self) -> OriginStats {
        self.0.stats()
    }
}

/// A bound origin, ready to [`Origin::run`].
pub struct Origin {
    listener: TcpListener,
    admin: Option<TcpListener>,
    state: Arc<State>,
    limits: ServeOptions,
}

impl Origin {
    /// Checks the content (an unreadable root fails here), then binds the
    /// listeners.
    pub async fn bind(config: OriginConfig) -> Result<Origin, OriginError> {
        let state = Arc::new(State::new(&config)?);
        let listener = bind(config.listen).await?;
        let admin = match config.admin_listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        Ok(Origin { listener, admin, state, limits: config.limits })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|admin| admin.local_addr().ok())
    }

    pub fn stats(&self) -> StatsReader {
        StatsReader(self.state.clone())
    }

    /// Serves until `stop` fires.
    pub async fn run(self, stop: Stop) -> std::io::Result<()> {
        let state = self.state.clone();
        let handler = Arc::new(move |request| state.clone().serve_client(request));
        let clients = serve_with_options(self.listener, handler, stop.clone(), None, self.limits);
        let Some(admin) = self.admin else { return clients.await };
        let state = self.state.clone();
        let handler = Arc::new(move |request| state.clone().serve_admin(request));
        let admin = serve_with_options(admin, handler, stop, None, self.limits);
        tokio::try_join!(clients, admin).map(|_| ())
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, OriginError> {
    TcpListener::bind(addr).await.map_err(|source| OriginError::Bind { addr, source })
}
