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
//!   `Message`s to the node's [`Inbox`];
//! - per peer, one outgoing connection, opened lazily and reopened after it
//!   breaks; callers write whole frames under a mutex (one `write_all`), and
//!   a **reader** thread completes pending requests by request id;
//! - a **sweeper** that fails requests past their deadline with
//!   [`FabricError::Timeout`]; answers arriving later are dropped.
//!
//! Key choices:
//! - **Every completion ends.** A request leaves its connection's pending
//!   table exactly once: answered, timed out by the sweeper, or failed with
//!   `PeerDead` when the connection breaks. The table is a pure state machine
//!   (`pending.rs`) with a model-based test.
//! - **Region indices are per connection.** A handle remembers the
//!   connection on which it looked its region up; on a new connection (after
//!   a break, possibly to a restarted owner) it looks the name up again, so it
//!   never addresses a different region by a stale index.
//! - **A bad peer fails alone.** Garbage, oversized frames or protocol
//!   violations close that connection (logged with `tracing`); nothing a peer
//!   sends can panic or stop the node.
//! - Posting may block briefly: `post` connects on first use (bounded by the
//!   op timeout) and writes the request before returning the completion.

mod client;
mod pending;
mod server;

use client::{Conn, Shape, Waiter};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;
use tierstack_base::limits::{NODES_MAX, REGIONS_PER_NODE_MAX, TRANSFER_BYTES_MAX};
use tierstack_base::{Clock, NodeId, SystemClock};
use tierstack_fabric::{
    check_batch, validate_region_name, Completion, Fabric, FabricError, Inbox, LocalRegion, Op, PeerState,
    RegionMemory, RemoteRegion, Result,
};
use tierstack_fabric_wire::{encode, Frame};

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
    /// with [`FabricError::Timeout`].
    pub op_timeout: Duration,
}

impl TcpConfig {
    pub const OP_TIMEOUT_DEFAULT: Duration = Duration::from_millis(1000);

    pub fn new(node: NodeId, listen: SocketAddr) -> Self {
        Self { node, listen, peers: HashMap::new(), op_timeout: Self::OP_TIMEOUT_DEFAULT }
    }

    pub fn with_peer(mut self, node: NodeId, addr: SocketAddr) -> Self {
        self.peers.insert(node, addr);
        self
    }

    pub fn with_peers(mut self, peers: impl IntoIterator<Item = (NodeId, SocketAddr)>) -> Self {
        self.peers.extend(peers);
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
    pub(crate) by_index: Vec<Arc<LocalRegion>>,
    pub(crate) by_name: HashMap<String, u32>,
}

/// A peer's current outgoing connection, if any.
type ConnSlot = Mutex<Option<Arc<Conn>>>;

/// State shared by the fabric handle, its threads and its region handles.
pub(crate) struct Shared {
    pub(crate) node: NodeId,
    pub(crate) op_timeout: Duration,
    pub(crate) timeout_ms: u64,
    local_addr: SocketAddr,
    /// `local_addr` with an unspecified IP replaced by loopback: how this
    /// node connects to itself.
    self_addr: SocketAddr,
    pub(crate) inbox: Inbox,
    pub(crate) regions: RwLock<Regions>,
    peers: Mutex<HashMap<NodeId, SocketAddr>>,
    /// Per peer, the slot of its outgoing connection; a slot's lock is held
    /// while (re)connecting, so one peer's slow connect delays no other.
    slots: Mutex<HashMap<NodeId, Arc<ConnSlot>>>,
    /// Outgoing connections whose reader runs, by connection id (the sweeper's list).
    live: Mutex<HashMap<u64, Arc<Conn>>>,
    /// Accepted connections, by id, to shut them down on close.
    pub(crate) accepted: Mutex<HashMap<u64, TcpStream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    listener_thread: Mutex<Option<JoinHandle<()>>>,
    next_id: AtomicU64,
    closed: AtomicBool,
    clock: SystemClock,
}

/// Locks a mutex, ignoring poisoning: every critical section here leaves its
/// data consistent, and a panic elsewhere must not take the fabric down.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl TcpFabric {
    /// Binds the listener and starts the node's threads.
    pub fn open(config: TcpConfig) -> Result<Arc<TcpFabric>> {
        if config.node.0 >= NODES_MAX {
            return Err(FabricError::UnknownNode { node: config.node });
        }
        if config.op_timeout.is_zero() {
            return Err(FabricError::Io("op_timeout must be positive".to_string()));
        }
        let listener = TcpListener::bind(config.listen)
            .map_err(|e| FabricError::Io(format!("binding {} for {}: {e}", config.listen, config.node)))?;
        let local_addr = listener.local_addr()?;
        let self_addr = match local_addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), local_addr.port()),
            IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), local_addr.port()),
            _ => local_addr,
        };
        let shared = Arc::new(Shared {
            node: config.node,
            op_timeout: config.op_timeout,
            timeout_ms: duration_ms(config.op_timeout),
            local_addr,
            self_addr,
            inbox: Inbox::new(config.node),
            regions: RwLock::new(Regions::default()),
            peers: Mutex::new(config.peers),
            slots: Mutex::new(HashMap::new()),
            live: Mutex::new(HashMap::new()),
            accepted: Mutex::new(HashMap::new()),
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
        let live: Vec<Arc<Conn>> = lock(&shared.live).values().cloned().collect();
        for conn in live {
            conn.kill(FabricError::Closed);
        }
        lock(&self.sweeper_stop).take();
        loop {
            let handles: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&shared.threads));
            if handles.is_empty() {
                break;
            }
            let me = std::thread::current().id();
            for handle in handles {
                // Never join the current thread (a fabric dropped by one of its own callbacks).
                if handle.thread().id() != me {
                    let _ = handle.join();
                }
            }
        }
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

    fn register(&self, name: &str, bytes: u64) -> Result<Arc<LocalRegion>> {
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
        let region = Arc::new(LocalRegion::new(name, RegionMemory::heap(name, bytes)?));
        regions.by_index.push(Arc::clone(&region));
        regions.by_name.insert(name.to_string(), index);
        Ok(region)
    }

    fn connect(&self, node: NodeId, name: &str) -> Result<Arc<dyn RemoteRegion>> {
        self.shared.check_open()?;
        validate_region_name(name)?;
        let conn = self.shared.conn(node)?;
        let (region, len) = self.shared.lookup(&conn, name)?;
        Ok(Arc::new(TcpRegion {
            shared: Arc::clone(&self.shared),
            node,
            name: name.to_string(),
            binding: Mutex::new(Binding { conn_id: conn.id, region, len }),
        }))
    }

    fn send(&self, to: NodeId, payload: &[u8]) -> Result<()> {
        self.shared.check_open()?;
        if payload.len() > TRANSFER_BYTES_MAX {
            return Err(FabricError::TransferTooLarge { len: payload.len() });
        }
        let conn = self.shared.conn(to)?;
        conn.send(&encode(&Frame::Message { payload: payload.to_vec() }))
    }

    fn inbox(&self) -> &Inbox {
        &self.shared.inbox
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

    fn check_open(&self) -> Result<()> {
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
        let handle = std::thread::Builder::new().name(name).spawn(f)?;
        let mut threads = lock(&self.threads);
        threads.retain(|h| !h.is_finished());
        threads.push(handle);
        Ok(())
    }

    fn addr_of(&self, node: NodeId) -> Result<SocketAddr> {
        if node == self.node {
            return Ok(self.self_addr);
        }
        lock(&self.peers).get(&node).copied().ok_or(FabricError::UnknownNode { node })
    }

    /// The live connection to `node`, dialing it if there is none.
    fn conn(self: &Arc<Self>, node: NodeId) -> Result<Arc<Conn>> {
        let addr = self.addr_of(node)?;
        let slot = Arc::clone(lock(&self.slots).entry(node).or_default());
        let mut slot = lock(&slot);
        if let Some(conn) = slot.as_ref() {
            if !conn.is_dead() {
                return Ok(Arc::clone(conn));
            }
        }
        self.check_open()?;
        let (conn, stream) = Conn::dial(self, self.next_id(), node, addr)?;
        {
            let mut live = lock(&self.live);
            // Checked under the `live` lock, which shutdown takes after
            // setting `closed`: a connection is either killed by shutdown or
            // never registered.
            if self.is_closed() {
                conn.kill(FabricError::Closed);
                return Err(FabricError::Closed);
            }
            live.insert(conn.id, Arc::clone(&conn));
        }
        let reader_shared = Arc::clone(self);
        let reader_conn = Arc::clone(&conn);
        let spawned = self.spawn(format!("tcp-{}-read{}", self.node.0, node.0), move || {
            client::run_reader(reader_shared, reader_conn, stream)
        });
        if let Err(e) = spawned {
            conn.kill(FabricError::PeerDead { node, reason: format!("cannot start a reader: {e}") });
            self.forget_conn(conn.id);
            return Err(e);
        }
        tracing::debug!(node = %self.node, peer = %node, %addr, "connected");
        *slot = Some(Arc::clone(&conn));
        Ok(conn)
    }

    pub(crate) fn forget_conn(&self, id: u64) {
        lock(&self.live).remove(&id);
    }

    /// Looks `name` up on `conn`: the region's index and length.
    fn lookup(&self, conn: &Conn, name: &str) -> Result<(u32, u64)> {
        let request = self.next_id();
        let (tx, rx) = flume::bounded(1);
        conn.register(request, self.deadline_ns(), Waiter::Lookup(tx))?;
        // A failed send kills the connection, which fails the waiter.
        let _ = conn.send(&encode(&Frame::Lookup { request, name: name.to_string() }));
        // The sweeper fails the request at its deadline; the bound here is a
        // second line of defence so a caller can never hang.
        match rx.recv_timeout(self.op_timeout.saturating_mul(2).saturating_add(SWEEP_INTERVAL_MAX)) {
            Ok(result) => result,
            Err(flume::RecvTimeoutError::Timeout) => {
                let error = FabricError::Timeout { node: conn.peer, timeout_ms: self.timeout_ms };
                conn.abandon(request, error.clone());
                Err(error)
            }
            Err(flume::RecvTimeoutError::Disconnected) => Err(FabricError::Closed),
        }
    }

    fn sweep(&self) {
        let now_ns = self.clock.now_ns();
        let live: Vec<Arc<Conn>> = lock(&self.live).values().cloned().collect();
        for conn in live {
            conn.expire(now_ns, self.timeout_ms);
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

/// Where a handle's region lives on a particular connection.
struct Binding {
    conn_id: u64,
    region: u32,
    len: u64,
}

/// A handle to a region of a node, reached over TCP.
struct TcpRegion {
    shared: Arc<Shared>,
    node: NodeId,
    name: String,
    binding: Mutex<Binding>,
}

impl TcpRegion {
    /// The region's index and length on `conn`, looking it up again when the
    /// binding was made on an earlier connection.
    fn bind(&self, conn: &Conn) -> Result<(u32, u64)> {
        {
            let binding = lock(&self.binding);
            if binding.conn_id == conn.id {
                return Ok((binding.region, binding.len));
            }
        }
        let (region, len) = self.shared.lookup(conn, &self.name)?;
        *lock(&self.binding) = Binding { conn_id: conn.id, region, len };
        Ok((region, len))
    }

    fn try_post(&self, ops: Vec<Op>) -> Result<Completion> {
        self.shared.check_open()?;
        let known_len = self.len();
        check_batch(&self.name, known_len, &ops)?;
        let conn = self.shared.conn(self.node)?;
        let (region, len) = self.bind(&conn)?;
        if len != known_len {
            // The owner was restarted with a differently sized region.
            check_batch(&self.name, len, &ops)?;
        }
        let expect: Vec<Shape> = ops.iter().map(Shape::of).collect();
        let request = self.shared.next_id();
        let frame = encode(&Frame::Ops { request, region, ops });
        let (completion, sender) = Completion::pending();
        conn.register(request, self.shared.deadline_ns(), Waiter::Ops { sender, expect })?;
        // A failed send kills the connection, which completes the waiter with
        // its error; the completion reports it.
        let _ = conn.send(&frame);
        Ok(completion)
    }
}

impl RemoteRegion for TcpRegion {
    fn node(&self) -> NodeId {
        self.node
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        lock(&self.binding).len
    }

    fn post(&self, ops: Vec<Op>) -> Completion {
        self.try_post(ops).unwrap_or_else(|error| Completion::ready(Err(error)))
    }
}
