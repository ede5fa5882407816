//! The `tcp` fabric backend: the honest two-sided baseline.
//!
//! Every "one-sided" operation on a remote region becomes a request frame
//! (`tierstack-fabric-wire`) over a TCP connection, executed by a responder
//! thread of the owner, which answers with a response frame. The owner's CPU
//! therefore takes part in every operation — exactly the cost the papers'
//! IPoIB/SDP/TCP baselines pay and RDMA avoids — which makes this backend the
//! yardstick the `shm` backend is measured against, and the one that works
//! across hosts.
//!
//! Main types: [`TcpFabric`] (one per node; implements
//! [`tierstack_fabric::Fabric`]) built from a [`TcpConfig`].
//!
//! Threads (std threads, blocking I/O, `TCP_NODELAY`):
//! - a **listener** accepting connections; each gets a **responder** that
//!   reads frames in order, executes `Ops` with
//!   [`tierstack_fabric::execute_on_memory`] after
//!   [`tierstack_fabric::check_batch`], answers `Lookup`, and delivers
//!   `Message`s to the node's [`Inbox`] of their channel;
//! - per peer, a **writer** that dials the peer (lazily, again after a
//!   break) and writes queued request frames, and a **reader** per request
//!   connection that completes pending requests by request id; messages go
//!   on connections of their own, one per peer and channel, written by the
//!   sender;
//! - a **sweeper** that fails requests past their deadline with
//!   [`FabricError::Timeout`], queued or sent; answers arriving later are
//!   dropped.
//!
//! Key choices:
//! - **Every completion ends.** A request leaves its peer's pending table
//!   exactly once: answered, timed out by the sweeper, or failed with
//!   `PeerDead` when its connection breaks or the dial fails. The table is a
//!   pure state machine (`pending.rs`) with a model-based test.
//! - **Posting never blocks on the network.** `post` validates, encodes,
//!   registers the waiter and queues the frame; the peer's writer thread
//!   dials and writes. A stalled peer holds its own writer, never a poster
//!   (an async runtime's worker, a proxy validating other modules' keys).
//! - **A handle is bound to one incarnation of its region.** Each
//!   registration draws a random 64-bit incarnation; `connect` learns it
//!   with the region's index, and every request carries both. An owner that
//!   restarted (same node id and address) has new incarnations, so an old
//!   handle fails with `PeerDead`, as an `shm` handle to a revoked region
//!   does, instead of reaching a zeroed region with its lock words reset.
//! - **A full inbox holds the sender back.** The responder of a message
//!   connection waits for room in the channel's inbox before reading on, so
//!   the sender's `send` waits (up to the op timeout, then `Timeout`); no
//!   message is dropped. Each channel has its own connection, so this never
//!   delays requests nor the sender's other channels.
//! - **Transfers naming local memory save the client's copy.** A
//!   `WriteFrom` is serialized straight from its local region into the
//!   request frame; a `ReadInto`'s answer is copied straight from the
//!   received frame into its local region (see `client.rs`). The owner sees
//!   plain `Write`/`Read` ops and serves them as before.
//! - **A bad peer fails alone.** Garbage, oversized frames or protocol
//!   violations close that connection (logged with `tracing`); nothing a peer
//!   sends can panic or stop the node.

mod client;
mod pending;
mod secure;
mod server;
mod tls;

pub use secure::HANDSHAKES_MAX;

use client::{Link, RegionInfo, Shape, Waiter};
use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;
use tierstack_base::limits::{REGIONS_PER_NODE_MAX, TRANSFER_BYTES_MAX};
use tierstack_base::{Clock, NodeId, SystemClock};
use tierstack_fabric::listen::{bind_node, Listening};
use tierstack_fabric::{
    check_batch, validate_region_name, Access, Channel, Completion, Fabric, FabricError, Inbox, Inboxes, LocalRegion,
    Op, PeerState, RegionMemory, RemoteRegion, Result, TrySend,
};
use tierstack_fabric_wire::auth::FabricKey;
use tierstack_fabric_wire::{encode, try_encode, Frame, WireError};
pub use tierstack_secret::ClusterKey;

/// How often a responder waiting for room in the inbox checks for shutdown.
pub(crate) const INBOX_WAIT_SLICE: Duration = Duration::from_millis(50);

/// Connections one node serves at once; more are refused (closed at accept).
pub const ACCEPTED_CONNECTIONS_MAX: usize = 1024;

/// Buffer of each connection's reading side: a small frame costs one `read`.
pub const READ_BUFFER_BYTES: usize = 64 * 1024;

/// The sweeper wakes every `op_timeout / SWEEPS_PER_TIMEOUT`, clamped to
/// [`SWEEP_INTERVAL_MIN`, `SWEEP_INTERVAL_MAX`]: a request fails at most one
/// interval after its deadline.
const SWEEPS_PER_TIMEOUT: u32 = 8;
const SWEEP_INTERVAL_MIN: Duration = Duration::from_millis(1);
const SWEEP_INTERVAL_MAX: Duration = Duration::from_millis(100);

/// How long `shutdown` waits to wake its own listener with a connection.
const WAKE_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Configuration of one node's [`TcpFabric`].
#[derive(Clone, Debug)]
pub struct TcpConfig {
    pub node: NodeId,
    /// Address to listen on; port 0 picks a free port ([`TcpFabric::local_addr`]).
    pub listen: SocketAddr,
    /// Where the other nodes listen. The node's own entry is ignored: it
    /// always reaches itself at its actual listening address.
    pub peers: HashMap<NodeId, SocketAddr>,
    /// How long a request (connect, lookup, batch) may take before it fails
    /// with [`FabricError::Timeout`]; also the deadline of a connection's
    /// handshake.
    pub op_timeout: Duration,
    /// The cluster's key: with it, every connection is mutually
    /// authenticated and every frame sealed (`secure.rs`); without it, peers
    /// are taken at their word, which [`TcpFabric::open`] allows only on a
    /// loopback address.
    pub key: Option<FabricKey>,
    /// Whether connections run inside TLS (needs `key`): for cluster
    /// networks that are not private (`tls.rs`).
    pub tls: bool,
}

impl TcpConfig {
    pub const OP_TIMEOUT_DEFAULT: Duration = Duration::from_millis(1000);

    pub fn new(node: NodeId, listen: SocketAddr) -> Self {
        Self { node, listen, peers: HashMap::new(), op_timeout: Self::OP_TIMEOUT_DEFAULT, key: None, tls: false }
    }

    pub fn with_peer(mut self, node: NodeId, addr: SocketAddr) -> Self {
        self.peers.insert(node, addr);
        self
    }

    pub fn with_peers(mut self, peers: impl IntoIterator<Item = (NodeId, SocketAddr)>) -> Self {
        self.peers.extend(peers);
        self
    }

    /// Authenticates every connection and frame with `key`.
    pub fn with_key(mut self, key: &ClusterKey) -> Self {
        self.key = Some(FabricKey::new(key));
        self
    }

    /// Runs every connection inside TLS 1.3 (the key still authenticates).
    pub fn with_tls(mut self) -> Self {
        self.tls = true;
        self
    }

    pub fn with_op_timeout(mut self, op_timeout: Duration) -> Self {
        self.op_timeout = op_timeout;
        self
    }
}

/// One node's attachment to the tcp fabric. Dropping it (or [`TcpFabric::shutdown`])
/// stops its threads and closes its sockets.
pub struct TcpFabric {
    shared: Arc<Shared>,
    sweeper_stop: Mutex<Option<flume::Sender<()>>>,
}

/// Regions registered by this node; indices are the wire's region ids.
#[derive(Default)]
pub(crate) struct Regions {
    pub(crate) by_index: Vec<Registered>,
    pub(crate) by_name: HashMap<String, u32>,
}

/// A registered region and its incarnation: a random id drawn at
/// registration, which requests must carry, so a handle made for an earlier
/// process on this node id never reaches this region.
pub(crate) struct Registered {
    pub(crate) region: Arc<LocalRegion>,
    pub(crate) incarnation: u64,
}

/// State shared by the fabric handle, its threads and its region handles.
pub(crate) struct Shared {
    pub(crate) node: NodeId,
    pub(crate) op_timeout: Duration,
    pub(crate) timeout_ms: u64,
    local_addr: SocketAddr,
    /// `local_addr` with an unspecified IP replaced by loopback: how this
    /// node connects to itself.
    self_addr: SocketAddr,
    pub(crate) inboxes: Inboxes,
    pub(crate) regions: RwLock<Regions>,
    peers: Mutex<HashMap<NodeId, SocketAddr>>,
    /// Per peer, its link (pending requests, writer queue, connections).
    links: Mutex<HashMap<NodeId, Arc<Link>>>,
    /// Accepted connections, by id, to shut them down on close.
    pub(crate) accepted: Mutex<HashMap<u64, TcpStream>>,
    /// Accepted connections still in their handshake, oldest first.
    pub(crate) handshaking: Mutex<BTreeMap<u64, TcpStream>>,
    /// The cluster key's fabric keys, if the cluster has a key.
    pub(crate) key: Option<FabricKey>,
    /// This process's incarnation, bound into every handshake.
    pub(crate) incarnation: u64,
    /// TLS configurations, when connections run inside TLS.
    pub(crate) tls: Option<tls::TlsContext>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    listener_thread: Mutex<Option<JoinHandle<()>>>,
    next_id: AtomicU64,
    closed: AtomicBool,
    clock: SystemClock,
}

pub(crate) use tierstack_fabric::threads::lock;

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl TcpFabric {
    /// Binds the listener and starts the node's threads.
    pub fn open(config: TcpConfig) -> Result<Arc<TcpFabric>> {
        if config.tls && config.key.is_none() {
            return Err(FabricError::Unauthenticated {
                node: config.node,
                reason: "TLS needs the cluster key: the key, not the certificate, proves who a peer is".into(),
            });
        }
        let tls = if config.tls { Some(tls::TlsContext::new()?) } else { None };
        if config.key.is_none() && !config.listen.ip().is_loopback() {
            return Err(FabricError::Unauthenticated {
                node: config.node,
                reason: format!(
                    "listening on {} without a cluster key would let anyone who reaches it act as any node: \
                     name a key (`[cluster] key_file`, made by `tierstack cluster key --out FILE`) or listen on loopback",
                    config.listen
                ),
            });
        }
        let Listening { listener, local_addr, self_addr } = bind_node(config.node, config.listen, config.op_timeout)?;
        let shared = Arc::new(Shared {
            node: config.node,
            op_timeout: config.op_timeout,
            timeout_ms: duration_ms(config.op_timeout),
            local_addr,
            self_addr,
            inboxes: Inboxes::new(config.node),
            regions: RwLock::new(Regions::default()),
            peers: Mutex::new(config.peers),
            links: Mutex::new(HashMap::new()),
            accepted: Mutex::new(HashMap::new()),
            handshaking: Mutex::new(BTreeMap::new()),
            incarnation: u64::from_le_bytes(tierstack_secret::random_nonce()),
            key: config.key,
            tls,
            threads: Mutex::new(Vec::new()),
            listener_thread: Mutex::new(None),
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            clock: SystemClock,
        });
        let (stop_tx, stop_rx) = flume::bounded::<()>(1);
        let fabric = Arc::new(TcpFabric { shared: Arc::clone(&shared), sweeper_stop: Mutex::new(Some(stop_tx)) });
        // From here on, an error drops `fabric`, whose shutdown stops what started.
        let listener_shared = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name(format!("tcp-{}-listen", config.node.0))
            .spawn(move || server::run_listener(listener_shared, listener))?;
        *lock(&shared.listener_thread) = Some(handle);
        let sweeper_shared = Arc::clone(&shared);
        shared.spawn(format!("tcp-{}-sweep", config.node.0), move || run_sweeper(&sweeper_shared, &stop_rx))?;
        tracing::debug!(node = %config.node, addr = %local_addr, "tcp fabric open");
        Ok(fabric)
    }

    /// The address the listener is bound to (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// Adds or changes a peer's address. Takes effect on the next connection
    /// to that peer.
    pub fn add_peer(&self, node: NodeId, addr: SocketAddr) {
        lock(&self.shared.peers).insert(node, addr);
    }

    /// The configured operation timeout.
    pub fn op_timeout(&self) -> Duration {
        self.shared.op_timeout
    }

    /// Stops the node: closes the listener and every connection, fails what
    /// is pending with [`FabricError::Closed`], and joins the threads.
    /// Later calls on the fabric or its handles fail with `Closed`.
    /// Idempotent; also run on drop.
    pub fn shutdown(&self) {
        let shared = &self.shared;
        if shared.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wake the listener out of `accept` with a connection of our own.
        let listener_thread = lock(&shared.listener_thread).take();
        if let Some(handle) = listener_thread {
            match TcpStream::connect_timeout(&shared.self_addr, WAKE_CONNECT_TIMEOUT) {
                Ok(_wake) => {
                    let _ = handle.join();
                }
                Err(e) => {
                    tracing::warn!(node = %shared.node, error = %e, "cannot wake the listener; leaving it blocked")
                }
            }
        }
        for stream in lock(&shared.accepted).values() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        let links: Vec<Arc<Link>> = lock(&shared.links).values().cloned().collect();
        for link in links {
            link.stop();
        }
        lock(&self.sweeper_stop).take();
        // Never joins the current thread (a fabric dropped by one of its own callbacks).
        tierstack_fabric::threads::join_all(&shared.threads);
        tracing::debug!(node = %shared.node, "tcp fabric shut down");
    }
}

impl Drop for TcpFabric {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl std::fmt::Debug for TcpFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpFabric").field("node", &self.shared.node).field("addr", &self.shared.local_addr).finish()
    }
}

impl Fabric for TcpFabric {
    fn local_node(&self) -> NodeId {
        self.shared.node
    }

    fn backend_name(&self) -> &'static str {
        "tcp"
    }

    fn register(&self, name: &str, bytes: u64, access: Access) -> Result<Arc<LocalRegion>> {
        self.shared.check_open()?;
        validate_region_name(name)?;
        let mut regions = self.shared.regions.write().unwrap_or_else(PoisonError::into_inner);
        if regions.by_name.contains_key(name) {
            return Err(FabricError::RegionExists { name: name.to_string() });
        }
        if regions.by_index.len() >= REGIONS_PER_NODE_MAX {
            return Err(FabricError::TooManyRegions { max: REGIONS_PER_NODE_MAX });
        }
        let index = u32::try_from(regions.by_index.len())
            .map_err(|_| FabricError::TooManyRegions { max: REGIONS_PER_NODE_MAX })?;
        let region = Arc::new(LocalRegion::with_access(name, RegionMemory::heap(name, bytes)?, access));
        let incarnation = self.shared.fresh_incarnation();
        regions.by_index.push(Registered { region: Arc::clone(&region), incarnation });
        regions.by_name.insert(name.to_string(), index);
        Ok(region)
    }

    fn connect(&self, node: NodeId, name: &str) -> Result<Arc<dyn RemoteRegion>> {
        self.shared.check_open()?;
        validate_region_name(name)?;
        let link = self.shared.link(node)?;
        let info = self.shared.lookup(&link, name)?;
        Ok(Arc::new(TcpRegion { shared: Arc::clone(&self.shared), link, name: name.to_string(), info }))
    }

    fn send(&self, to: NodeId, channel: Channel, payload: &[u8]) -> Result<()> {
        self.shared.check_open()?;
        if payload.len() > TRANSFER_BYTES_MAX {
            return Err(FabricError::TransferTooLarge { len: payload.len() });
        }
        let link = self.shared.link(to)?;
        link.send_message(&self.shared, channel, payload)
    }

    fn try_send(&self, to: NodeId, channel: Channel, payload: &[u8]) -> Result<TrySend> {
        self.shared.check_open()?;
        if payload.len() > TRANSFER_BYTES_MAX {
            return Err(FabricError::TransferTooLarge { len: payload.len() });
        }
        let link = self.shared.link(to)?;
        link.try_send_message(&self.shared, channel, payload)
    }

    fn inbox(&self, channel: Channel) -> &Inbox {
        self.shared.inboxes.get(channel)
    }

    /// By a fresh connection to the peer's listener: refused means no
    /// process listens there any more; an accepted connection means one
    /// runs; anything else (a timeout) tells nothing.
    fn peer_state(&self, node: NodeId) -> PeerState {
        if node == self.shared.node {
            return PeerState::Running;
        }
        let Some(addr) = lock(&self.shared.peers).get(&node).copied() else { return PeerState::Unknown };
        match TcpStream::connect_timeout(&addr, self.shared.op_timeout) {
            Ok(probe) => {
                let _ = probe.shutdown(std::net::Shutdown::Both);
                PeerState::Running
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => PeerState::Gone,
            Err(_) => PeerState::Unknown,
        }
    }
}

impl Shared {
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.is_closed() {
            return Err(FabricError::Closed);
        }
        Ok(())
    }

    /// A fresh id for requests and connections, unique within this fabric.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn deadline_ns(&self) -> u64 {
        self.clock.now_ns().saturating_add(duration_ns(self.op_timeout))
    }

    /// Spawns a named thread that shutdown joins.
    pub(crate) fn spawn(&self, name: String, f: impl FnOnce() + Send + 'static) -> Result<()> {
        Ok(tierstack_fabric::threads::spawn_tracked(&self.threads, name, f)?)
    }

    /// A new region incarnation: random (seeded per process by the OS),
    /// mixed with the time and a counter, so a restarted node never repeats
    /// an earlier process's.
    fn fresh_incarnation(&self) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        hasher.write_u64(self.clock.now_ns());
        hasher.write_u64(self.next_id());
        hasher.finish()
    }

    pub(crate) fn addr_of(&self, node: NodeId) -> Result<SocketAddr> {
        if node == self.node {
            return Ok(self.self_addr);
        }
        lock(&self.peers).get(&node).copied().ok_or(FabricError::UnknownNode { node })
    }

    /// The link to `node`, made (and its writer started) on first use.
    /// Touches no socket.
    fn link(self: &Arc<Self>, node: NodeId) -> Result<Arc<Link>> {
        self.addr_of(node)?;
        let mut links = lock(&self.links);
        if let Some(link) = links.get(&node) {
            return Ok(Arc::clone(link));
        }
        // Checked under the `links` lock, which shutdown takes after setting
        // `closed`: a link is either stopped by shutdown or never made.
        self.check_open()?;
        let (link, queue) = Link::new(node);
        let (writer_shared, writer_link) = (Arc::clone(self), Arc::clone(&link));
        self.spawn(format!("tcp-{}-write{}", self.node.0, node.0), move || {
            client::run_writer(&writer_shared, &writer_link, &queue)
        })?;
        links.insert(node, Arc::clone(&link));
        Ok(link)
    }

    /// Looks `name` up at `link`'s peer: the region's index, incarnation and
    /// length. Blocks (bounded), as `connect` may.
    fn lookup(&self, link: &Link, name: &str) -> Result<RegionInfo> {
        let request = self.next_id();
        let (tx, rx) = flume::bounded(1);
        let bytes = encode(&Frame::Lookup { request, name: name.to_string() });
        link.submit(request, self.deadline_ns(), bytes, Waiter::Lookup(tx));
        // The sweeper fails the request at its deadline; the bound here is a
        // second line of defence so a caller can never hang.
        match rx.recv_timeout(self.op_timeout.saturating_mul(2).saturating_add(SWEEP_INTERVAL_MAX)) {
            Ok(result) => result,
            Err(flume::RecvTimeoutError::Timeout) => {
                let error = FabricError::Timeout { node: link.peer, timeout_ms: self.timeout_ms };
                link.abandon(request, error.clone());
                Err(error)
            }
            Err(flume::RecvTimeoutError::Disconnected) => Err(FabricError::Closed),
        }
    }

    fn sweep(&self) {
        let now_ns = self.clock.now_ns();
        let links: Vec<Arc<Link>> = lock(&self.links).values().cloned().collect();
        for link in links {
            link.expire(now_ns, self.timeout_ms);
        }
    }
}

fn run_sweeper(shared: &Shared, stop: &flume::Receiver<()>) {
    let interval = (shared.op_timeout / SWEEPS_PER_TIMEOUT).clamp(SWEEP_INTERVAL_MIN, SWEEP_INTERVAL_MAX);
    // Runs until the stop sender is dropped (or sends).
    while let Err(flume::RecvTimeoutError::Timeout) = stop.recv_timeout(interval) {
        shared.sweep();
    }
}

/// A handle to one incarnation of a region of a node, reached over TCP.
struct TcpRegion {
    shared: Arc<Shared>,
    link: Arc<Link>,
    name: String,
    info: RegionInfo,
}

impl TcpRegion {
    /// Validates, encodes and queues the batch; the writer sends it.
    fn try_post(&self, ops: Vec<Op>) -> Result<Completion> {
        self.shared.check_open()?;
        check_batch(&self.name, self.info.len, &ops)?;
        let expect: Vec<Shape> = ops.iter().map(Shape::of).collect();
        let request = self.shared.next_id();
        let RegionInfo { region, incarnation, .. } = self.info;
        // A `WriteFrom`'s source is copied into the frame here, its one copy.
        let bytes = try_encode(&Frame::Ops { request, region, incarnation, ops }).map_err(|e| match e {
            WireError::Unencodable(error) => error,
            other => FabricError::Io(format!("encoding a batch: {other}")),
        })?;
        let (completion, sender) = Completion::pending();
        self.link.submit(request, self.shared.deadline_ns(), bytes, Waiter::Ops { sender, expect });
        Ok(completion)
    }
}

impl RemoteRegion for TcpRegion {
    fn node(&self) -> NodeId {
        self.link.peer
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.info.len
    }

    fn post(&self, ops: Vec<Op>) -> Completion {
        self.try_post(ops).unwrap_or_else(|error| Completion::ready(Err(error)))
    }
}
