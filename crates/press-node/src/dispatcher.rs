//! The dispatcher hand-off server's front end: one process accepts every
//! client connection, reads its request's header block, chooses a back-end
//! node by locality ([`tierstack_press::Lard`], LARD) and hands the socket
//! to it ([`crate::handoff`]); the back-ends (`Mode::Traditional` nodes
//! with a hand-off directory) answer the clients directly and report each
//! connection's end, which is the dispatcher's load count.
//!
//! This follows the task's LARD-style front end; the paper's dispatcher is
//! instead consulted by the nodes on their local cache misses (seed-notes
//! c.4): here every request is handed off once.

use crate::handoff::{self, read_head, send_fd};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tierstack_press::{Lard, LardConfig, LardError};
use tierstack_tier_http::{serve, text, Stop};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// The dispatcher's configuration.
#[derive(Clone, Debug)]
pub struct DispatcherConfig {
    pub listen: SocketAddr,
    pub admin: Option<SocketAddr>,
    /// Back-ends `0..backends`, their sockets under `dir`.
    pub backends: usize,
    pub dir: PathBuf,
    pub lard: LardConfig,
}

/// What can stop a dispatcher from starting.
#[derive(Debug, thiserror::Error)]
pub enum DispatcherError {
    #[error(transparent)]
    Lard(#[from] LardError),
    #[error("binding {what}: {source}")]
    Bind { what: String, source: std::io::Error },
    #[error("starting the report thread: {0}")]
    Thread(std::io::Error),
}

/// The dispatcher's counters (`GET /stats` on its admin listener).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DispatcherStats {
    /// Connections whose request was read.
    pub requests: u64,
    /// Connections handed to each back-end.
    pub handed: Vec<u64>,
    /// Hand-offs that failed (the next choice was tried).
    pub handoff_failures: u64,
    /// Connections no back-end took (answered 503).
    pub unserved: u64,
    /// Connections closed before a whole request header.
    pub bad_requests: u64,
    /// Connection ends reported by the back-ends.
    pub done_reports: u64,
    /// Targets moved by LARD's load rule.
    pub reassignments: u64,
    /// Each back-end's open connections as LARD counts them.
    pub loads: Vec<u32>,
}

/// The admin listener's `/metrics` (and `/readyz`: ready until stopped).
struct DispatcherObserved(Arc<State>);

impl tierstack_tier_http::observe::Observed for DispatcherObserved {
    fn metrics(&self, out: &mut tierstack_stats::exposition::Exposition) {
        let stats = self.0.stats();
        out.counter("tierstack_dispatcher_requests_total", "Connections whose request head was read.", stats.requests);
        let names: Vec<String> = (0..stats.handed.len()).map(|b| b.to_string()).collect();
        let labels: Vec<[(&str, &str); 1]> = names.iter().map(|n| [("backend", n.as_str())]).collect();
        let handed: Vec<(&[(&str, &str)], u64)> = labels.iter().zip(&stats.handed).map(|(l, v)| (&l[..], *v)).collect();
        out.counters("tierstack_dispatcher_handed_total", "Connections handed to each back-end.", &handed);
        out.counter(
            "tierstack_dispatcher_handoff_failures_total",
            "Hand-offs that failed (the next choice was tried).",
            stats.handoff_failures,
        );
        out.counter(
            "tierstack_dispatcher_unserved_total",
            "Connections no back-end took (answered 503).",
            stats.unserved,
        );
        out.counter(
            "tierstack_dispatcher_bad_requests_total",
            "Connections closed before a whole request head.",
            stats.bad_requests,
        );
        out.counter("tierstack_dispatcher_reassignments_total", "Targets LARD's load rule moved.", stats.reassignments);
        let loads: Vec<(&[(&str, &str)], f64)> =
            labels.iter().zip(&stats.loads).map(|(l, v)| (&l[..], f64::from(*v))).collect();
        out.gauges(
            "tierstack_dispatcher_backend_connections",
            "Each back-end's open connections as LARD counts them.",
            &loads,
        );
    }

    fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        let stopped = self.0.stop.load(Ordering::Relaxed);
        vec![("serving", if stopped { Err("stopping".into()) } else { Ok(()) })]
    }
}

struct State {
    lard: Mutex<Lard<String>>,
    backends: usize,
    dir: PathBuf,
    reply: PathBuf,
    sockets: Mutex<Vec<Option<Arc<UnixDatagram>>>>,
    requests: AtomicU64,
    handed: Vec<AtomicU64>,
    failures: AtomicU64,
    unserved: AtomicU64,
    bad: AtomicU64,
    done: AtomicU64,
    stop: AtomicBool,
}

impl State {
    fn lard(&self) -> std::sync::MutexGuard<'_, Lard<String>> {
        self.lard.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stats(&self) -> DispatcherStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let lard = self.lard();
        DispatcherStats {
            requests: get(&self.requests),
            handed: self.handed.iter().map(get).collect(),
            handoff_failures: get(&self.failures),
            unserved: get(&self.unserved),
            bad_requests: get(&self.bad),
            done_reports: get(&self.done),
            reassignments: lard.reassignments(),
            loads: lard.loads().to_vec(),
        }
    }

    fn socket(&self, backend: usize) -> std::io::Result<Arc<UnixDatagram>> {
        let mut sockets = self.sockets.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = sockets.get_mut(backend).ok_or_else(|| std::io::Error::other("no such back-end"))?;
        if let Some(s) = slot {
            return Ok(s.clone());
        }
        let socket = UnixDatagram::unbound()?;
        socket.connect(handoff::socket_path(&self.dir, backend))?;
        socket.set_write_timeout(Some(Duration::from_secs(1)))?;
        let socket = Arc::new(socket);
        *slot = Some(socket.clone());
        Ok(socket)
    }

    async fn hand(&self, backend: usize, stream: &TcpStream, payload: Vec<u8>) -> std::io::Result<()> {
        let socket = self.socket(backend)?;
        let fd = stream.as_raw_fd();
        // `stream` outlives the blocking send: it is awaited here.
        let result = tokio::task::spawn_blocking(move || send_fd(&socket, fd, &payload))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        if result.is_err() {
            if let Some(slot) = self.sockets.lock().unwrap_or_else(PoisonError::into_inner).get_mut(backend) {
                *slot = None;
            }
        }
        result
    }

    async fn accepted(self: Arc<Self>, mut stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let head = match read_head(&mut stream).await {
            Ok(head) => head,
            Err(e) => {
                self.bad.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "no request to dispatch");
                return;
            }
        };
        self.requests.fetch_add(1, Ordering::Relaxed);
        let payload = match handoff::encode(u16::MAX, 0, Some(&self.reply), &head.bytes) {
            Ok(payload) => payload,
            Err(e) => {
                tracing::warn!(error = %e, "hand-off payload");
                return;
            }
        };
        // Each back-end at most once: a failed one is forgotten by LARD.
        for _ in 0..self.backends {
            let backend = self.lard().assign(&head.path);
            match self.hand(backend, &stream, payload.clone()).await {
                Ok(()) => {
                    if let Some(h) = self.handed.get(backend) {
                        h.fetch_add(1, Ordering::Relaxed);
                    }
                    return;
                }
                Err(e) => {
                    self.failures.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(backend, error = %e, "hand-off failed");
                    let mut lard = self.lard();
                    lard.finished(backend);
                    lard.forget_backend(backend);
                }
            }
        }
        self.unserved.fetch_add(1, Ordering::Relaxed);
        let _ = stream
            .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .await;
    }

    /// The back-ends' `done` reports.
    fn report_loop(&self, socket: UnixDatagram) {
        if socket.set_read_timeout(Some(Duration::from_millis(50))).is_err() {
            return;
        }
        let mut buf = [0u8; 16];
        while !self.stop.load(Ordering::Relaxed) {
            let Ok(n) = socket.recv(&mut buf) else { continue };
            if let Some(backend) = handoff::parse_done(&buf[..n]) {
                self.done.fetch_add(1, Ordering::Relaxed);
                self.lard().finished(usize::from(backend));
            }
        }
    }
}

/// A running dispatcher.
pub struct Dispatcher {
    state: Arc<State>,
    stop: Stop,
    accept_stop: tokio::sync::watch::Sender<bool>,
    local_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    reports: Option<std::thread::JoinHandle<()>>,
}

impl Dispatcher {
    /// Binds its listeners and report socket and serves on the current
    /// tokio runtime until [`Dispatcher::stop`].
    pub async fn start(config: DispatcherConfig) -> Result<Dispatcher, DispatcherError> {
        let lard = Lard::new(config.lard, config.backends)?;
        let bind = |what: &str| {
            let what = what.to_string();
            move |source| DispatcherError::Bind { what, source }
        };
        let listener = TcpListener::bind(config.listen).await.map_err(bind(&config.listen.to_string()))?;
        let local_addr = listener.local_addr().map_err(bind("the listener"))?;
        let admin = match config.admin {
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(bind(&addr.to_string()))?),
            None => None,
        };
        let admin_addr = admin.as_ref().and_then(|l| l.local_addr().ok());
        let reply = config.dir.join(format!("press-dispatcher-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&reply);
        let report_socket = UnixDatagram::bind(&reply).map_err(bind(&reply.display().to_string()))?;
        let state = Arc::new(State {
            lard: Mutex::new(lard),
            backends: config.backends,
            dir: config.dir,
            reply,
            sockets: Mutex::new(vec![None; config.backends]),
            requests: AtomicU64::new(0),
            handed: (0..config.backends).map(|_| AtomicU64::new(0)).collect(),
            failures: AtomicU64::new(0),
            unserved: AtomicU64::new(0),
            bad: AtomicU64::new(0),
            done: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let reports = {
            let state = state.clone();
            std::thread::Builder::new()
                .name("press-dispatch-reports".into())
                .spawn(move || state.report_loop(report_socket))
                .map_err(DispatcherError::Thread)?
        };
        let stop = Stop::new();
        let (accept_stop, mut stopped) = tokio::sync::watch::channel(false);
        {
            let state = state.clone();
            tokio::spawn(async move {
                loop {
                    let (stream, _) = tokio::select! {
                        accepted = tierstack_tier_http::accept(&listener) => accepted,
                        _ = stopped.changed() => return,
                    };
                    tokio::spawn(state.clone().accepted(stream));
                }
            });
        }
        if let Some(admin) = admin {
            let state = state.clone();
            let handler = Arc::new(move |request: hyper::Request<tierstack_tier_http::RequestBody>| {
                let state = state.clone();
                async move {
                    if let Some(answer) =
                        tierstack_tier_http::observe::respond(&request, &DispatcherObserved(state.clone()))
                    {
                        return answer;
                    }
                    if request.uri().path() != "/stats" {
                        let paths = "the admin listener serves GET /stats, /metrics, /healthz and /readyz\n";
                        return text(hyper::StatusCode::NOT_FOUND, paths);
                    }
                    match serde_json::to_string(&state.stats()) {
                        Ok(json) => text(hyper::StatusCode::OK, json),
                        Err(e) => text(hyper::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
                    }
                }
            });
            tokio::spawn(serve(admin, handler, stop.clone()));
        }
        Ok(Dispatcher { state, stop, accept_stop, local_addr, admin_addr, reports: Some(reports) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    pub fn stats(&self) -> DispatcherStats {
        self.state.stats()
    }

    /// Stops accepting and the report thread; returns the final counters.
    pub fn stop(mut self) -> DispatcherStats {
        self.stop.stop();
        let _ = self.accept_stop.send(true);
        self.state.stop.store(true, Ordering::Relaxed);
        if let Some(reports) = self.reports.take() {
            let _ = reports.join();
        }
        let _ = std::fs::remove_file(&self.state.reply);
        self.state.stats()
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        self.stop.stop();
        let _ = self.accept_stop.send(true);
        self.state.stop.store(true, Ordering::Relaxed);
    }
}
