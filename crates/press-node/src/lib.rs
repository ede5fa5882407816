//! `tierstack press-node`: one node of a PRESS cluster (Carrera and
//! Bianchini, TPDS 2005), a real HTTP/1.1 server.
//!
//! Every node accepts clients (any node is an *initial node*) and serves
//! the regular files under a document root ([`files`]: GET and HEAD,
//! strong ETag from size and mtime, Last-Modified, 304, single byte
//! ranges, MIME types by extension, errors as status codes: [`http`]).
//! The trace mode writes a trace's synthetic set (`synthetic_body`, so a
//! client can check every byte) to a directory once and serves it the
//! same way. Its memory cache holds the files' bytes in a slab ([`slab`],
//! registered for Zero) whose contents follow the cost model
//! (`tierstack_model::Storage`: an LRU-by-bytes cache, optionally in front
//! of an emulated FIFO disk); a cached copy is revalidated by a stat on
//! every request, reads from disk run on the blocking pool, and large
//! files the cache does not keep are streamed from disk. In
//! [`Mode::Press`] each request runs Fig. 1 (`tierstack_press::decide`) over
//! the node's `ClusterView`; a request for a file another node caches is
//! forwarded to it on the fabric's `Channel::PRESS` and its reply relayed to
//! the client; the initial node does not cache what it relays; the service
//! node serves what reaches it and never forwards it again. Caching changes
//! are broadcast; every message carries the sender's load (open client
//! connections plus forwarded requests in service). [`Mode::Traditional`]
//! is the same code without distribution or dissemination.
//!
//! Communication versions ([`TransportKind`]): `tcp` (fabric messages on the
//! `tcp` backend), `base` (fabric messages on the `shm` backend plus
//! PRESS's window flow control), `rdma-1c` (one-sided writes into
//! per-pair rings in the receiver's registered memory, polled, one copy at
//! the receiver: [`rings`]), `rdma` (the reply served to the client from
//! the ring) and `zero` (as `rdma`, the file written from the sender's
//! registered cache, [`slab`]).
//!
//! A forwarded file's reply carries the service node's validators with its
//! bytes, so the initial node answers as the service node would.
//!
//! A failed or unanswered forward opens the peer's circuit breaker
//! (`tierstack_press::Breakers`): its requests are served locally, without
//! waiting, for a cool-down, then one probe decides; so a hung (SIGSTOPped)
//! peer costs one bounded wait (`forward_timeout`) per cool-down, not one
//! per request. A peer whose process ended (`Fabric::peer_state` is `Gone`)
//! also leaves the view, so its files are taken over by others.
//!
//! Counters: JSON at the admin listener's `GET /stats`, Prometheus text on
//! `--metrics-listen` (`PressNode::observed`).

mod args;
pub mod dispatcher;
pub mod files;
pub mod handoff;
mod ho;
pub mod http;
mod metrics;
mod node;
pub mod rings;
pub mod slab;
pub mod transport;

pub use args::{
    DispatcherArgs, PressNodeArgs, DISPATCHER_THREADS_DEFAULT, FORWARD_TIMEOUT_MS_DEFAULT, NODE_THREADS_DEFAULT,
};
pub use transport::{TransportKind, Window, WINDOW_DEFAULT};

use node::{LoadGuard, Shared, Stats};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tierstack_base::time::instant_now;
use tierstack_fabric::Fabric;
use tierstack_origin::StorageConfig;
use tierstack_press::{ClusterView, Member, PolicyConfig, ViewError};
use tierstack_tier_http::{serve, serve_with_options, text, ConnectionHook, Stop};
use tokio::net::TcpListener;

/// Distribution on or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Fig. 1, broadcasts, forwarding.
    Press,
    /// The locality-oblivious server: every node serves its own requests.
    Traditional,
    /// The distributed hand-off server: Fig. 1 and its dissemination as in
    /// `Press`, but a request for another node's file is served by passing
    /// the client's socket to that node ([`handoff`]), which answers the
    /// client directly. Needs [`NodeConfig::handoff_dir`].
    DistribHandoff,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Press => "press",
            Mode::Traditional => "traditional",
            Mode::DistribHandoff => "distrib-ho",
        }
    }

    /// Whether the node runs Fig. 1 and disseminates caching information.
    pub fn distributes(self) -> bool {
        matches!(self, Mode::Press | Mode::DistribHandoff)
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "press" => Ok(Mode::Press),
            "traditional" => Ok(Mode::Traditional),
            "distrib-ho" => Ok(Mode::DistribHandoff),
            other => Err(format!("unknown mode {other:?} (expected press, traditional or distrib-ho)")),
        }
    }
}

/// A node's configuration.
#[derive(Clone)]
pub struct NodeConfig {
    pub listen: SocketAddr,
    pub admin: Option<SocketAddr>,
    /// This node's index; the fabric node id equals it.
    pub me: Member,
    /// Cluster size: nodes `0..nodes`.
    pub nodes: usize,
    pub mode: Mode,
    pub transport: TransportKind,
    pub policy: PolicyConfig,
    pub storage: StorageConfig,
    /// The served directory.
    pub root: files::Root,
    /// Longest wait for a forwarded request's reply before serving locally.
    pub forward_timeout: Duration,
    /// How long a peer whose forward failed is skipped before a probe.
    pub breaker_cool_down: Duration,
    /// Base's flow-control window, in messages per ordered pair.
    pub window: u32,
    /// Send inline from the async task when nothing has to wait (else every
    /// send goes through the blocking pool: the old path, kept to measure).
    pub send_inline: bool,
    /// Where the nodes' hand-off sockets live (`handoff::socket_path`):
    /// with it, the node accepts client sockets handed to it (by its
    /// distributed hand-off peers or a dispatcher); `Mode::DistribHandoff`
    /// needs it.
    pub handoff_dir: Option<std::path::PathBuf>,
    /// The client listener's limits (slow clients, connections).
    pub limits: tierstack_tier_http::ServeOptions,
}

/// What can stop a node from starting.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    View(#[from] ViewError),
    #[error("the {transport} transport needs the {needs} fabric, the topology gives {got}")]
    Backend { transport: &'static str, needs: &'static str, got: &'static str },
    #[error("the fabric's node id {fabric} is not this node's index {me}")]
    NodeId { fabric: u32, me: u16 },
    #[error("binding {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("starting the receive thread: {0}")]
    Thread(std::io::Error),
    #[error("setting up the transport: {0}")]
    Link(transport::LinkError),
    #[error("the distributed hand-off server needs a hand-off directory")]
    NoHandoffDir,
    #[error("binding the hand-off socket under {dir}: {source}")]
    Handoff { dir: std::path::PathBuf, source: std::io::Error },
}

/// A node's counters (the admin listener's `GET /stats`, and the exit line).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStats {
    pub node: u16,
    pub transport: String,
    pub mode: String,
    /// Client requests received (this node was their initial node).
    pub requests: u64,
    /// Client requests served here from cache or disk, cached as usual.
    pub served_local: u64,
    /// Client requests of `max_size` or more, served here uncached.
    pub served_uncached: u64,
    /// Client requests forwarded to a service node (hand-off: whose
    /// connection was handed to it).
    pub forwarded: u64,
    /// Forwarded requests this node served for others (hand-off servers:
    /// requests on connections handed to this node).
    pub served_for_peers: u64,
    /// Forwarded requests whose file came back and was relayed.
    pub replies_relayed: u64,
    /// Forwarded requests served here because the service node failed.
    pub forward_fallbacks: u64,
    pub peers_declared_dead: u64,
    /// Ring versions: peers found restarted (a new epoch at sequence 1),
    /// after which both directions towards them started over.
    #[serde(default)]
    pub ring_peer_restarts: u64,
    pub bad_messages: u64,
    pub send_failures: u64,
    /// Zero: forwarded files sent by a copy because they were not in the
    /// registered cache.
    pub zero_copy_fallbacks: u64,
    /// Intra-cluster sends made inline from the request's task.
    #[serde(default)]
    pub sends_inline: u64,
    /// Sends handed to a blocking thread because they would have waited.
    #[serde(default)]
    pub sends_blocking: u64,
    /// Files whose bytes are in the memory cache's slab (registered for Zero).
    pub slab_files: u64,
    pub caching_broadcasts: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub disk_reads: u64,
    pub cache_bytes: u64,
    pub cache_objects: u64,
    pub load: u32,
    /// Messages sent, by Table 2 type (Flow, Forward, Caching, File).
    pub sent_messages: [u64; 4],
    /// Bytes sent, by Table 2 type.
    pub sent_bytes: [u64; 4],
    pub files_in_view: u64,
    /// Cached copies dropped because their file changed on disk.
    #[serde(default)]
    pub revalidated: u64,
    /// Responses streamed from disk (large files not cached).
    #[serde(default)]
    pub streamed: u64,
    /// Cached files the slab had no room for.
    #[serde(default)]
    pub slab_full: u64,
    /// The peers' circuit breakers: opened, forwards skipped, probes, closed by a probe.
    #[serde(default)]
    pub breaker: [u64; 4],
    /// The receiver's waits and wake-ups, doorbells, Zero's slab sends.
    #[serde(default)]
    pub link: transport::LinkStats,
}

impl NodeStats {
    /// The counts as `tierstack_press::Counts`, to sum nodes and print Table 2.
    pub fn counts(&self) -> tierstack_press::Counts {
        tierstack_press::Counts { messages: self.sent_messages, bytes: self.sent_bytes }
    }
}

/// A running node.
pub struct PressNode {
    shared: Arc<Shared>,
    stop: Stop,
    /// Stops the distributed hand-off server's accept loop.
    accept_stop: tokio::sync::watch::Sender<bool>,
    local_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    receiver: Option<std::thread::JoinHandle<()>>,
    poller: Option<std::thread::JoinHandle<()>>,
    handoff_receiver: Option<std::thread::JoinHandle<()>>,
}

impl PressNode {
    /// Binds the listeners, starts the receive thread and serves, on the
    /// current tokio runtime, until [`PressNode::stop`].
    pub async fn start(config: NodeConfig, fabric: Arc<dyn Fabric>) -> Result<PressNode, NodeError> {
        let view = ClusterView::new(config.nodes, config.me)?;
        let got = fabric.backend_name();
        if config.mode.distributes() && got != config.transport.backend() {
            return Err(NodeError::Backend {
                transport: config.transport.name(),
                needs: config.transport.backend(),
                got,
            });
        }
        if fabric.local_node().0 != u32::from(config.me.0) {
            return Err(NodeError::NodeId { fabric: fabric.local_node().0, me: config.me.0 });
        }
        let listener =
            TcpListener::bind(config.listen).await.map_err(|source| NodeError::Bind { addr: config.listen, source })?;
        let local_addr = listener.local_addr().map_err(|source| NodeError::Bind { addr: config.listen, source })?;
        let admin = match config.admin {
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(|source| NodeError::Bind { addr, source })?),
            None => None,
        };
        let admin_addr = admin.as_ref().and_then(|l| l.local_addr().ok());
        let link = transport::Link::new(
            fabric,
            config.transport,
            config.me,
            config.nodes,
            config.window,
            config.forward_timeout,
        )
        .map_err(NodeError::Link)?;
        // Room for every cached file with its metadata and 8-byte rounding,
        // and slack against first-fit fragmentation: with a quarter more and
        // one largest cacheable file (`max_size`), 7 of 184k inserts found
        // no room in a replay of an LRU of 4 MiB over 2,000 files of 100 B
        // to 200 KB (an eighth more: 1,598). The slack is memory for the
        // heap slab (zeroed at start), address space for Zero's (a sparse
        // shared-memory file).
        let slab_bytes = config
            .storage
            .cache_bytes
            .saturating_add(config.storage.cache_bytes / 4)
            .saturating_add(config.policy.max_size_bytes)
            .saturating_add(4096);
        let slab = match config.transport {
            TransportKind::Zero if config.mode.distributes() => slab::Slab::register(link.fabric(), slab_bytes),
            _ => slab::Slab::heap(slab_bytes),
        }
        .map_err(|e| NodeError::Link(e.into()))?;
        let breakers = Mutex::new(tierstack_press::Breakers::new(
            config.nodes,
            u64::try_from(config.breaker_cool_down.as_nanos()).unwrap_or(u64::MAX),
        ));
        if config.mode == Mode::DistribHandoff && config.handoff_dir.is_none() {
            return Err(NodeError::NoHandoffDir);
        }
        let handoff_socket = match &config.handoff_dir {
            Some(dir) => {
                Some(ho::bind(dir, config.me).map_err(|source| NodeError::Handoff { dir: dir.clone(), source })?)
            }
            None => None,
        };
        let handoff_out = match (&config.handoff_dir, config.mode) {
            (Some(dir), Mode::DistribHandoff) => Some(ho::Outbound::new(dir.clone(), config.nodes)),
            _ => None,
        };
        let shared = Arc::new(Shared {
            handoff_out,
            storage: Mutex::new(tierstack_origin::Storage::new(config.storage)),
            config,
            link,
            view: Mutex::new(view),
            started: instant_now(),
            load: Arc::new(AtomicU32::new(0)),
            pending: Mutex::new(HashMap::new()),
            next_request: AtomicU64::new(0),
            stats: Stats::default(),
            stop: AtomicBool::new(false),
            runtime: tokio::runtime::Handle::current(),
            slab,
            breakers,
        });
        let receiver = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("press-recv".into())
                .spawn(move || shared.receive_loop())
                .map_err(NodeError::Thread)?
        };
        let poller = match shared.link.rings() {
            Some(_) => {
                let shared = shared.clone();
                Some(
                    std::thread::Builder::new()
                        .name("press-poll".into())
                        .spawn(move || shared.poll_loop())
                        .map_err(NodeError::Thread)?,
                )
            }
            None => None,
        };
        let handoff_receiver = match handoff_socket {
            Some(socket) => {
                let shared = shared.clone();
                Some(
                    std::thread::Builder::new()
                        .name("press-handoff".into())
                        .spawn(move || shared.handoff_receive_loop(socket))
                        .map_err(NodeError::Thread)?,
                )
            }
            None => None,
        };
        let stop = Stop::new();
        let (accept_stop, accept_stopped) = tokio::sync::watch::channel(false);
        if shared.config.mode == Mode::DistribHandoff {
            tokio::spawn(ho::accept_loop(shared.clone(), listener, accept_stopped));
        } else {
            let load = shared.load.clone();
            let hook: ConnectionHook = Arc::new(move || Box::new(LoadGuard::new(&load)) as Box<dyn Send>);
            let handler = {
                let shared = shared.clone();
                Arc::new(move |request| shared.clone().handle(request))
            };
            let limits = shared.config.limits;
            tokio::spawn(serve_with_options(listener, handler, stop.clone(), Some(hook), limits));
        }
        if let Some(admin) = admin {
            let shared = shared.clone();
            let handler = Arc::new(move |request: hyper::Request<tierstack_tier_http::RequestBody>| {
                let shared = shared.clone();
                async move {
                    if request.uri().path() != "/stats" {
                        return text(hyper::StatusCode::NOT_FOUND, "the admin listener serves GET /stats\n");
                    }
                    match serde_json::to_string(&shared.snapshot()) {
                        Ok(json) => text(hyper::StatusCode::OK, json),
                        Err(e) => text(hyper::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
                    }
                }
            });
            tokio::spawn(serve(admin, handler, stop.clone()));
        }
        Ok(PressNode {
            shared,
            stop,
            accept_stop,
            local_addr,
            admin_addr,
            receiver: Some(receiver),
            poller,
            handoff_receiver,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    pub fn stats(&self) -> NodeStats {
        self.shared.snapshot()
    }

    /// Stops serving and the receive thread; returns the final counters.
    pub fn stop(mut self) -> NodeStats {
        self.stop.stop();
        let _ = self.accept_stop.send(true);
        self.shared.stop.store(true, Ordering::Relaxed);
        for thread in [self.receiver.take(), self.handoff_receiver.take()].into_iter().flatten() {
            let _ = thread.join();
        }
        if let Some(poller) = self.poller.take() {
            let _ = poller.join();
        }
        self.shared.snapshot()
    }
}

impl Drop for PressNode {
    fn drop(&mut self) {
        self.stop.stop();
        let _ = self.accept_stop.send(true);
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}
