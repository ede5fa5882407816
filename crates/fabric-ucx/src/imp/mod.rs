//! The backend proper (compiled when UCX was found): the fabric handle,
//! bootstrap listener and watches, message delivery, and region handles.
//! See the crate docs for the design.

mod progress;
mod ucx;

use crate::bootstrap::{Conn, Frame};
use crate::UcxConfig;
use progress::{Command, Submitter};
use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;
use tierstack_base::limits::{CHANNELS_MAX, NODES_MAX, REGIONS_PER_NODE_MAX, TRANSFER_BYTES_MAX};
use tierstack_base::NodeId;
use tierstack_fabric::listen::{bind_node, Listening};
use tierstack_fabric::Rights;
use tierstack_fabric::{
    check_batch, validate_region_bytes, validate_region_name, Access, Channel, Completion, Fabric, FabricError, Inbox,
    Inboxes, LocalRegion, Message, Op, PeerState, RegionMemory, RemoteRegion, Result, TrySend,
};
use tierstack_fabric_wire::auth::{self, FabricKey};
use ucx::Context;

/// How often a thread blocked on a socket or an inbox looks at shutdown.
const WAIT_SLICE: Duration = Duration::from_millis(50);
/// How long closing a node waits for each peer to answer its `BYE`.
const BYE_BOUND: Duration = Duration::from_millis(500);
/// Bootstrap connections one node serves at once; more are refused.
const BOOTSTRAP_CONNECTIONS_MAX: usize = 1024;

use tierstack_fabric::threads::lock;

/// What this node knows about a peer's process: the generation of its
/// endpoint (one per peer process), and whether it died.
struct PeerLink {
    node: NodeId,
    generation: u64,
    dead: Mutex<Option<String>>,
    /// Messages `try_send` sent to this process without waiting.
    detached: Arc<Detached>,
}

/// Messages [`Fabric::try_send`] sent to one peer process and nobody waits
/// on: how many are not yet acknowledged (at most [`DETACHED_MAX`]: then a
/// try would block, so a receiver that holds messages back holds back its
/// senders as a blocking send's wait does), and the first failure among
/// them, which the next `try_send` to that peer returns.
#[derive(Default)]
pub(crate) struct Detached {
    in_flight: AtomicUsize,
    failed: Mutex<Option<FabricError>>,
}

/// Unacknowledged `try_send` messages per peer before a try would block.
const DETACHED_MAX: usize = 64;

/// Who hears how a message send ended (its acknowledgement or failure).
pub(crate) enum SendReply {
    /// A blocking `send` waits on it.
    Waiter(flume::Sender<Result<()>>),
    /// A `try_send` that did not wait.
    Detached(Arc<Detached>),
}

impl SendReply {
    pub(crate) fn answer(self, result: Result<()>) {
        match self {
            SendReply::Waiter(tx) => {
                let _ = tx.send(result);
            }
            SendReply::Detached(detached) => {
                if let Err(e) = result {
                    lock(&detached.failed).get_or_insert(e);
                }
                detached.in_flight.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

impl PeerLink {
    fn check(&self) -> Result<()> {
        match &*lock(&self.dead) {
            Some(reason) => Err(FabricError::PeerDead { node: self.node, reason: reason.clone() }),
            None => Ok(()),
        }
    }

    fn is_dead(&self) -> bool {
        lock(&self.dead).is_some()
    }
}

/// A registered region and what peers need to reach it.
struct Registered {
    region: Arc<LocalRegion>,
    base: u64,
    rkey: Vec<u8>,
}

/// A message waiting for room in its inbox, on its channel's delivery thread.
struct Pending {
    message: Message,
    msg_id: u64,
}

/// State shared by the handle, the progress thread, the bootstrap threads
/// and region handles.
pub(crate) struct Shared {
    node: NodeId,
    op_timeout: Duration,
    local_addr: SocketAddr,
    self_addr: SocketAddr,
    /// Set once at open, before any other thread runs.
    worker_address: OnceLock<Vec<u8>>,
    submitter: OnceLock<Arc<Submitter>>,
    context: Arc<Context>,
    /// Peers' worker addresses, by node, as learned from hellos.
    addresses: Mutex<HashMap<NodeId, Vec<u8>>>,
    inboxes: Inboxes,
    regions: RwLock<HashMap<String, Registered>>,
    peers: Mutex<HashMap<NodeId, SocketAddr>>,
    links: Mutex<HashMap<NodeId, Arc<PeerLink>>>,
    /// Open hello connections (ours and accepted), to say `BYE` on close.
    watches: Mutex<HashMap<u64, Arc<Mutex<Conn>>>>,
    /// The cluster key's fabric keys, if the cluster has a key.
    key: Option<FabricKey>,
    /// This process's incarnation, bound into every handshake.
    incarnation: u64,
    /// Per channel: messages handed to its delivery thread and not yet in
    /// the inbox (while non-zero, later messages queue behind them).
    backlog: [AtomicUsize; CHANNELS_MAX],
    delivery: Mutex<Vec<Option<flume::Sender<Pending>>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    next_id: AtomicU64,
    closed: AtomicBool,
}

/// One node's attachment to the ucx fabric. Dropping it (or
/// [`UcxFabric::shutdown`]) tells peers, stops its threads and closes UCX.
pub struct UcxFabric {
    shared: Arc<Shared>,
    progress: Mutex<Option<JoinHandle<()>>>,
    listener: Mutex<Option<JoinHandle<()>>>,
}

impl UcxFabric {
    /// Initializes UCX, starts the progress thread and binds the bootstrap listener.
    pub fn open(config: UcxConfig) -> Result<Arc<UcxFabric>> {
        let Listening { listener, local_addr, self_addr } = bind_node(config.node, config.listen, config.op_timeout)?;
        let context = Arc::new(Context::new(config.transports.as_deref())?);
        let shared = Arc::new(Shared::new(&config, local_addr, self_addr, Arc::clone(&context)));
        let node = config.node;
        // The worker is made here and used only by the progress thread from
        // its start on (the spawn orders the two).
        let (state, submitter, worker_address) =
            progress::Progress::new(Arc::clone(&shared), context, config.transports.as_deref())?;
        let _ = shared.submitter.set(submitter);
        let _ = shared.worker_address.set(worker_address);
        let progress =
            std::thread::Builder::new().name(format!("ucx-{}-progress", node.0)).spawn(move || state.run())?;
        let fabric = Arc::new(UcxFabric {
            shared: Arc::clone(&shared),
            progress: Mutex::new(Some(progress)),
            listener: Mutex::new(None),
        });
        let listener_shared = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name(format!("ucx-{}-listen", node.0))
            .spawn(move || run_listener(&listener_shared, &listener))?;
        *lock(&fabric.listener) = Some(handle);
        tracing::debug!(%node, addr = %local_addr, "ucx fabric open");
        Ok(fabric)
    }

    /// The bootstrap listener's address (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// Adds or changes a peer's bootstrap address (used from its next hello).
    pub fn add_peer(&self, node: NodeId, addr: SocketAddr) {
        lock(&self.shared.peers).insert(node, addr);
    }

    /// Closes the node: says `BYE` on every hello connection and waits
    /// (bounded) for the answers, so peers have marked this node dead when
    /// it returns; then stops the listener, the delivery threads and the
    /// progress thread (which fails what waits with `Closed`). Idempotent;
    /// also run on drop. Region memory stays valid while its
    /// `LocalRegion`s live.
    pub fn shutdown(&self) {
        let shared = &self.shared;
        if shared.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let watches: Vec<Arc<Mutex<Conn>>> = lock(&shared.watches).drain().map(|(_, c)| c).collect();
        for conn in watches {
            let mut conn = lock(&conn);
            let _ = conn.stream.set_read_timeout(Some(BYE_BOUND));
            if conn.send(&Frame::Bye).is_ok() {
                // The answer (a BYE, or the close) means the peer marked us dead.
                let _ = conn.recv();
            }
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
        if let Some(handle) = lock(&self.listener).take() {
            // Wake the listener out of `accept`.
            if TcpStream::connect_timeout(&shared.self_addr, Duration::from_secs(1)).is_ok() {
                let _ = handle.join();
            }
        }
        lock(&shared.delivery).iter_mut().for_each(|slot| drop(slot.take()));
        if let Some(submitter) = shared.submitter.get() {
            submitter.wake();
        }
        if let Some(handle) = lock(&self.progress).take() {
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
        // Threads may start others while we join (a bootstrap connection
        // starting its watch): take the list again until it stays empty, and
        // never hold its lock while joining.
        tierstack_fabric::threads::join_all(&shared.threads);
        tracing::debug!(node = %shared.node, "ucx fabric shut down");
    }
}

impl Drop for UcxFabric {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl std::fmt::Debug for UcxFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UcxFabric").field("node", &self.shared.node).field("addr", &self.shared.local_addr).finish()
    }
}

impl Shared {
    fn new(config: &UcxConfig, local_addr: SocketAddr, self_addr: SocketAddr, context: Arc<Context>) -> Shared {
        let self_link =
            Arc::new(PeerLink { node: config.node, generation: 0, dead: Mutex::new(None), detached: Arc::default() });
        Shared {
            node: config.node,
            op_timeout: config.op_timeout,
            local_addr,
            self_addr,
            worker_address: OnceLock::new(),
            submitter: OnceLock::new(),
            context,
            addresses: Mutex::new(HashMap::new()),
            inboxes: Inboxes::new(config.node),
            regions: RwLock::new(HashMap::new()),
            peers: Mutex::new(config.peers.clone()),
            links: Mutex::new(HashMap::from([(config.node, self_link)])),
            watches: Mutex::new(HashMap::new()),
            key: config.key.clone(),
            incarnation: u64::from_le_bytes(tierstack_secret::random_nonce()),
            backlog: std::array::from_fn(|_| AtomicUsize::new(0)),
            delivery: Mutex::new((0..CHANNELS_MAX).map(|_| None).collect()),
            threads: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
        }
    }

    fn submit(&self, command: Command) -> Result<()> {
        self.submitter.get().ok_or(FabricError::Closed)?.submit(command)
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn check_open(&self) -> Result<()> {
        if self.is_closed() {
            return Err(FabricError::Closed);
        }
        Ok(())
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn timeout_error(&self, node: NodeId) -> FabricError {
        FabricError::Timeout { node, timeout_ms: u64::try_from(self.op_timeout.as_millis()).unwrap_or(u64::MAX) }
    }

    /// Waits for a progress-thread answer, bounded (the thread answers
    /// within the op timeout; this is the second line of defence).
    fn await_reply<T>(&self, node: NodeId, rx: &flume::Receiver<Result<T>>) -> Result<T> {
        match rx.recv_timeout(self.op_timeout.saturating_mul(2).saturating_add(Duration::from_millis(100))) {
            Ok(result) => result,
            Err(flume::RecvTimeoutError::Timeout) => Err(self.timeout_error(node)),
            Err(flume::RecvTimeoutError::Disconnected) => Err(FabricError::Closed),
        }
    }

    fn spawn(&self, name: String, f: impl FnOnce() + Send + 'static) -> Result<()> {
        Ok(tierstack_fabric::threads::spawn_tracked(&self.threads, name, f)?)
    }

    /// Marks `node`'s current process dead for every handle, and has the
    /// progress thread fail what waits on it.
    pub(crate) fn mark_dead(&self, node: NodeId, reason: &str) {
        let link = lock(&self.links).get(&node).cloned();
        if let Some(link) = link {
            if node == self.node {
                return;
            }
            let mut dead = lock(&link.dead);
            if dead.is_none() {
                *dead = Some(reason.to_string());
                drop(dead);
                let _ =
                    self.submit(Command::PeerGone { node, generation: link.generation, reason: reason.to_string() });
            }
        }
    }

    /// Records a peer process with worker `address` (from a hello, either
    /// way) and has the progress thread make its endpoint. Keeps the link
    /// of the same process; a new process (another address) gets a new one.
    fn install_link(&self, node: NodeId, address: Vec<u8>) -> Result<Arc<PeerLink>> {
        let mut known = lock(&self.addresses);
        let mut links = lock(&self.links);
        if let Some(link) = links.get(&node) {
            if known.get(&node) == Some(&address) && !link.is_dead() {
                return Ok(Arc::clone(link));
            }
        }
        let link =
            Arc::new(PeerLink { node, generation: self.next_id(), dead: Mutex::new(None), detached: Arc::default() });
        let (tx, rx) = flume::bounded(1);
        self.submit(Command::Connect { node, generation: link.generation, address: address.clone(), reply: tx })?;
        self.await_reply(node, &rx)?;
        if let Some(old) = links.insert(node, Arc::clone(&link)) {
            lock(&old.dead).get_or_insert_with(|| "replaced by a new process of the same node id".to_string());
        }
        known.insert(node, address);
        Ok(link)
    }

    fn addr_of(&self, node: NodeId) -> Result<SocketAddr> {
        lock(&self.peers).get(&node).copied().ok_or(FabricError::UnknownNode { node })
    }

    /// A bootstrap connection to `node`, authenticated when the cluster has a key.
    fn dial(&self, node: NodeId) -> Result<Conn> {
        let mut stream = self.dial_stream(node)?;
        let Some(key) = &self.key else { return Ok(Conn::plain(stream)) };
        let session = auth::connect_over(&mut stream, key, self.node, self.incarnation, node, b"")
            .map_err(|e| FabricError::Unauthenticated { node, reason: e.to_string() })?;
        Ok(Conn::sealed(stream, session))
    }

    fn dial_stream(&self, node: NodeId) -> Result<TcpStream> {
        let addr = self.addr_of(node)?;
        let stream = TcpStream::connect_timeout(&addr, self.op_timeout).map_err(|e| match e.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                FabricError::PeerDead { node, reason: format!("its bootstrap address {addr} refused: {e}") }
            }
            std::io::ErrorKind::TimedOut => self.timeout_error(node),
            _ => FabricError::Io(format!("dialing {node} at {addr}: {e}")),
        })?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(self.op_timeout))?;
        stream.set_write_timeout(Some(self.op_timeout))?;
        Ok(stream)
    }

    /// One request and its answer on a fresh bootstrap connection.
    fn exchange(&self, node: NodeId, conn: &mut Conn, request: &Frame) -> Result<Frame> {
        let io = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => self.timeout_error(node),
            _ => FabricError::PeerDead { node, reason: format!("bootstrap connection: {e}") },
        };
        conn.send(request).map_err(io)?;
        match conn.recv() {
            Ok(Some(Frame::Refused { reason })) => Err(FabricError::Protocol { node, reason }),
            Ok(Some(frame)) => Ok(frame),
            Ok(None) => Err(FabricError::PeerDead { node, reason: "it closed the bootstrap connection".into() }),
            Err(crate::bootstrap::BootstrapError::Io(e)) => Err(io(e)),
            Err(e) => Err(FabricError::Protocol { node, reason: e.to_string() }),
        }
    }
}

impl Shared {
    /// The link to `node`'s current process: the known one if alive, else a
    /// new hello (which also starts the watch of that process).
    fn link(self: &Arc<Self>, node: NodeId) -> Result<Arc<PeerLink>> {
        if let Some(link) = lock(&self.links).get(&node) {
            if !link.is_dead() {
                return Ok(Arc::clone(link));
            }
        }
        self.check_open()?;
        let mut conn = self.dial(node)?;
        let address = self.worker_address.get().ok_or(FabricError::Closed)?.clone();
        let answer = self.exchange(node, &mut conn, &Frame::Hello { node: self.node.0, address })?;
        let Frame::Welcome { address } = answer else {
            return Err(FabricError::Protocol { node, reason: format!("expected WELCOME, got {answer:?}") });
        };
        let link = self.install_link(node, address)?;
        self.watch(node, link.generation, conn)?;
        Ok(link)
    }

    /// Keeps a hello connection as the liveness watch of `node`'s process
    /// `generation`: a thread reads it; `BYE` (answered with `BYE`), an end
    /// of stream or an error marks that process dead.
    fn watch(self: &Arc<Self>, node: NodeId, generation: u64, conn: Conn) -> Result<()> {
        conn.stream.set_read_timeout(None)?;
        let poll_stream = conn.stream.try_clone()?;
        let id = self.next_id();
        let conn = Arc::new(Mutex::new(conn));
        lock(&self.watches).insert(id, Arc::clone(&conn));
        let shared = Arc::clone(self);
        self.spawn(format!("ucx-{}-watch{}", self.node.0, node.0), move || {
            // Wait for something to read, looking at our own shutdown every
            // slice: a watch never outlives its node.
            while !shared.is_closed() && !readable(&poll_stream, WAIT_SLICE) {}
            let reason = if shared.is_closed() {
                String::new()
            } else {
                let mut conn = lock(&conn);
                match conn.recv() {
                    Ok(Some(Frame::Bye)) => {
                        let bye = "it closed its node".to_string();
                        shared.mark_dead_generation(node, generation, &bye);
                        let _ = conn.send(&Frame::Bye);
                        bye
                    }
                    Ok(Some(other)) => format!("unexpected {other:?} on its hello connection"),
                    Ok(None) => "its hello connection closed".to_string(),
                    Err(e) => format!("its hello connection failed: {e}"),
                }
            };
            // On our own shutdown the watch is closed by us: nothing to mark.
            if !shared.is_closed() {
                shared.mark_dead_generation(node, generation, &reason);
            }
            lock(&shared.watches).remove(&id);
        })
    }

    fn mark_dead_generation(&self, node: NodeId, generation: u64, reason: &str) {
        let current = lock(&self.links).get(&node).map(|l| l.generation);
        if current == Some(generation) {
            self.mark_dead(node, reason);
        }
    }

    /// Called by the progress thread for an arrived message: puts it in its
    /// inbox now if it can (true: acknowledge it now), else hands it to the
    /// channel's delivery thread, which acknowledges it once delivered.
    /// Never blocks the progress thread.
    pub(crate) fn deliver_now(self: &Arc<Self>, from: NodeId, channel: Channel, msg_id: u64, payload: Vec<u8>) -> bool {
        let message = Message { from, channel, payload };
        let backlog = &self.backlog[channel.index()];
        // Earlier messages of this channel still wait: queue behind them.
        if backlog.load(Ordering::Acquire) != 0 {
            self.hand_over(Pending { message, msg_id });
            return false;
        }
        match self.inboxes.deliver_timeout(message, Duration::ZERO) {
            Ok(None) => true,
            Ok(Some(message)) => {
                self.hand_over(Pending { message, msg_id });
                false
            }
            Err(e) => {
                tracing::warn!(%from, %channel, error = %e, "ucx: a message could not be delivered");
                false
            }
        }
    }

    /// Queues a message on its channel's delivery thread (started on first
    /// use), which waits for room in the inbox.
    fn hand_over(self: &Arc<Self>, pending: Pending) {
        let channel = pending.message.channel;
        let index = channel.index();
        let mut delivery = lock(&self.delivery);
        if delivery[index].is_none() && !self.is_closed() {
            let (tx, rx) = flume::unbounded::<Pending>();
            let shared = Arc::clone(self);
            let started =
                self.spawn(format!("ucx-{}-deliver{}", self.node.0, channel.id()), move || shared.run_delivery(&rx));
            match started {
                Ok(()) => delivery[index] = Some(tx),
                Err(e) => tracing::warn!(error = %e, "ucx: cannot start a delivery thread"),
            }
        }
        let Some(tx) = &delivery[index] else { return };
        self.backlog[index].fetch_add(1, Ordering::AcqRel);
        if tx.send(pending).is_err() {
            self.backlog[index].fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// A channel's delivery thread: waits for room for each message in turn,
    /// then has the progress thread acknowledge it. Ends on shutdown.
    fn run_delivery(&self, rx: &flume::Receiver<Pending>) {
        loop {
            let pending = match rx.recv_timeout(WAIT_SLICE) {
                Ok(pending) => pending,
                Err(flume::RecvTimeoutError::Timeout) if !self.is_closed() => continue,
                Err(_) => return,
            };
            let index = pending.message.channel.index();
            let from = pending.message.from;
            let mut message = pending.message;
            loop {
                match self.inboxes.deliver_timeout(message, WAIT_SLICE) {
                    Ok(None) => {
                        let _ = self.submit(Command::Ack { node: from, msg_id: pending.msg_id });
                        break;
                    }
                    Ok(Some(back)) if !self.is_closed() => message = back,
                    _ => break,
                }
            }
            self.backlog[index].fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Whether `stream` has something to read (or hung up) within `timeout`.
fn readable(stream: &TcpStream, timeout: Duration) -> bool {
    // An error counts as not readable: the caller looks at its shutdown and waits again.
    tierstack_fabric::listen::wait_ready(stream, libc::POLLIN, Some(timeout)).unwrap_or(false)
}

/// Accepts bootstrap connections; each is served by a thread of its own.
fn run_listener(shared: &Arc<Shared>, listener: &TcpListener) {
    let open = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        if shared.is_closed() {
            return;
        }
        let Ok(stream) = stream else { continue };
        if open.load(Ordering::Acquire) >= BOOTSTRAP_CONNECTIONS_MAX {
            let _ = stream.shutdown(Shutdown::Both);
            continue;
        }
        open.fetch_add(1, Ordering::AcqRel);
        let (serving, open_count) = (Arc::clone(shared), Arc::clone(&open));
        let spawned = shared.spawn(format!("ucx-{}-boot", shared.node.0), move || {
            serve(&serving, stream);
            open_count.fetch_sub(1, Ordering::AcqRel);
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "ucx: cannot serve a bootstrap connection");
        }
    }
}

/// Serves one bootstrap connection: a lookup, or a hello that then becomes
/// the watch of the peer that sent it. A bad peer only loses its connection.
/// With a cluster key, the connection's handshake comes first, and the node
/// a request names must be the one the handshake proved.
fn serve(shared: &Arc<Shared>, mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(shared.op_timeout));
    let _ = stream.set_write_timeout(Some(shared.op_timeout));
    let (mut conn, proven) = match &shared.key {
        None => (Conn::plain(stream), None),
        Some(key) => {
            let session = auth::read_handshake_frame(&mut stream).and_then(|hello| match hello {
                Some(hello) => {
                    auth::accept_over(&mut stream, key, shared.node, shared.incarnation, &hello, b"").map(Some)
                }
                None => Ok(None),
            });
            match session {
                Ok(Some(session)) => {
                    let peer = session.peer;
                    (Conn::sealed(stream, session), Some(peer))
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(node = %shared.node, error = %e, "ucx: refusing a bootstrap connection");
                    let _ = stream.shutdown(Shutdown::Both);
                    return;
                }
            }
        }
    };
    let request = match conn.recv() {
        Ok(Some(frame)) => frame,
        Ok(None) => return,
        Err(e) => {
            tracing::debug!(error = %e, "ucx: a bad bootstrap request");
            return;
        }
    };
    let claimed = match &request {
        Frame::Lookup { node, .. } | Frame::Hello { node, .. } => Some(NodeId(*node)),
        _ => None,
    };
    if let (Some(proven), Some(claimed)) = (proven, claimed) {
        if proven != claimed {
            let reason = format!("the handshake proved {proven}, the request claims {claimed}");
            tracing::warn!(node = %shared.node, %reason, "ucx: refusing a bootstrap request");
            let _ = conn.send(&Frame::Refused { reason });
            return;
        }
    }
    match request {
        Frame::Lookup { node, name } => {
            let answer = match shared.regions.read().unwrap_or_else(PoisonError::into_inner).get(&name) {
                Some(r) => {
                    let rights = r.region.access().rights_of(NodeId(node));
                    // A remote key is a capability: none for a peer without rights.
                    let rkey = if rights == Rights::NONE { Vec::new() } else { r.rkey.clone() };
                    Frame::Region { len: r.region.len(), base: r.base, rights: rights.bits(), rkey }
                }
                None => Frame::NoRegion,
            };
            let _ = conn.send(&answer);
        }
        Frame::Hello { node, address } => {
            let node = NodeId(node);
            if shared.is_closed() {
                let _ = conn.send(&Frame::Refused { reason: "the node is closing".into() });
                return;
            }
            let link = match shared.install_link(node, address) {
                Ok(link) => link,
                Err(e) => {
                    let _ = conn.send(&Frame::Refused { reason: e.to_string() });
                    return;
                }
            };
            let Some(address) = shared.worker_address.get().cloned() else { return };
            if conn.send(&Frame::Welcome { address }).is_ok() {
                if let Err(e) = shared.watch(node, link.generation, conn) {
                    tracing::warn!(%node, error = %e, "ucx: cannot watch a peer");
                }
            }
        }
        other => {
            let _ = conn.send(&Frame::Refused { reason: format!("unexpected request {other:?}") });
        }
    }
}

impl Fabric for UcxFabric {
    fn local_node(&self) -> NodeId {
        self.shared.node
    }

    fn backend_name(&self) -> &'static str {
        "ucx"
    }

    fn register(&self, name: &str, bytes: u64, access: Access) -> Result<Arc<LocalRegion>> {
        let shared = &self.shared;
        shared.check_open()?;
        validate_region_name(name)?;
        let bytes = validate_region_bytes(bytes)?;
        let mut regions = shared.regions.write().unwrap_or_else(PoisonError::into_inner);
        if regions.contains_key(name) {
            return Err(FabricError::RegionExists { name: name.to_string() });
        }
        if regions.len() >= REGIONS_PER_NODE_MAX {
            return Err(FabricError::TooManyRegions { max: REGIONS_PER_NODE_MAX });
        }
        let (tx, rx) = flume::bounded(1);
        shared.submit(Command::Map { bytes, widest: access.widest(), reply: tx })?;
        let mapped = shared.await_reply(shared.node, &rx)?;
        let owner = Mapping {
            memh: mapped.memh,
            submitter: Arc::downgrade(self.submitter()?),
            context: Arc::clone(&shared.context),
        };
        let base =
            NonNull::new(mapped.base as *mut u8).ok_or_else(|| FabricError::Io("ucp_mem_map gave no memory".into()))?;
        // SAFETY: UCX allocated `bytes` bytes at `base` (checked 8-aligned and
        // long enough in `Context::map`), valid until `owner` unmaps them;
        // others reach them only through UCX's RMA and atomics.
        let memory = unsafe { RegionMemory::from_raw(name, base, bytes, Box::new(owner))? };
        // UCX does not promise zeroed memory; the fabric does.
        memory.write(0, &vec![0u8; bytes as usize])?;
        let region = Arc::new(LocalRegion::with_access(name, memory, access));
        regions.insert(
            name.to_string(),
            Registered { region: Arc::clone(&region), base: mapped.base as u64, rkey: mapped.rkey },
        );
        Ok(region)
    }

    fn connect(&self, node: NodeId, name: &str) -> Result<Arc<dyn RemoteRegion>> {
        let shared = &self.shared;
        shared.check_open()?;
        validate_region_name(name)?;
        if node.0 >= NODES_MAX {
            return Err(FabricError::UnknownNode { node });
        }
        let (link, len, base, rights, rkey) = if node == shared.node {
            let regions = shared.regions.read().unwrap_or_else(PoisonError::into_inner);
            let r = regions.get(name).ok_or_else(|| FabricError::UnknownRegion { node, name: name.to_string() })?;
            let link = lock(&shared.links).get(&node).cloned().ok_or(FabricError::Closed)?;
            // The owner's own handle has every right, as its local region does.
            (link, r.region.len(), r.base, Rights::ALL, r.rkey.clone())
        } else {
            let link = shared.link(node)?;
            let mut conn = shared.dial(node)?;
            let lookup = Frame::Lookup { node: shared.node.0, name: name.to_string() };
            match shared.exchange(node, &mut conn, &lookup)? {
                Frame::Region { len, base, rights, rkey } => (link, len, base, Rights::from_bits(rights), rkey),
                Frame::NoRegion => return Err(FabricError::UnknownRegion { node, name: name.to_string() }),
                other => return Err(FabricError::Protocol { node, reason: format!("expected REGION, got {other:?}") }),
            }
        };
        link.check()?;
        if rights == Rights::NONE {
            return Err(FabricError::Forbidden {
                node: shared.node,
                region: name.to_string(),
                needed: Rights::READ,
                granted: Rights::NONE,
            });
        }
        let (tx, rx) = flume::bounded(1);
        shared.submit(Command::Unpack { node, generation: link.generation, rkey, reply: tx })?;
        let rkey = shared.await_reply(node, &rx)?;
        Ok(Arc::new(UcxRegion { shared: Arc::clone(shared), link, name: name.to_string(), len, base, rights, rkey }))
    }

    fn send(&self, to: NodeId, channel: Channel, payload: &[u8]) -> Result<()> {
        let shared = &self.shared;
        check_message(shared, to, payload)?;
        let link = shared.link(to)?;
        link.check()?;
        let (tx, rx) = flume::bounded(1);
        shared.submit(Command::Send {
            node: to,
            generation: link.generation,
            channel,
            payload: payload.to_vec(),
            reply: SendReply::Waiter(tx),
        })?;
        shared.await_reply(to, &rx)
    }

    /// Hands the message to the progress thread without waiting for its
    /// acknowledgement, unless the peer is not wired up yet (wiring up
    /// waits) or [`DETACHED_MAX`] such messages to it are unacknowledged.
    /// Order with `send`s holds: both go through the progress thread's one
    /// queue and the peer's one endpoint, and its delivery keeps them in order.
    fn try_send(&self, to: NodeId, channel: Channel, payload: &[u8]) -> Result<TrySend> {
        let shared = &self.shared;
        check_message(shared, to, payload)?;
        let Some(link) = lock(&shared.links).get(&to).cloned() else { return Ok(TrySend::WouldBlock) };
        link.check()?;
        if let Some(e) = lock(&link.detached.failed).take() {
            return Err(e);
        }
        let in_flight = &link.detached.in_flight;
        if in_flight.fetch_add(1, Ordering::AcqRel) >= DETACHED_MAX {
            in_flight.fetch_sub(1, Ordering::AcqRel);
            return Ok(TrySend::WouldBlock);
        }
        let command = Command::Send {
            node: to,
            generation: link.generation,
            channel,
            payload: payload.to_vec(),
            reply: SendReply::Detached(Arc::clone(&link.detached)),
        };
        if let Err(e) = shared.submit(command) {
            in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(e);
        }
        Ok(TrySend::Sent)
    }

    fn inbox(&self, channel: Channel) -> &Inbox {
        self.shared.inboxes.get(channel)
    }

    /// A dead watch says `Gone`; otherwise a fresh connection to the peer's
    /// bootstrap listener: refused means no process listens there any
    /// more, accepted means one runs, anything else tells nothing.
    fn peer_state(&self, node: NodeId) -> PeerState {
        let shared = &self.shared;
        if node == shared.node {
            return PeerState::Running;
        }
        // A dead link proves only that the process it led to is gone: a new
        // process of the same node id may run since (clients restarted
        // between rounds), so the probe decides. Reporting Gone on the dead
        // link had the lock manager of DDSS take a live holder's lock.
        let Ok(addr) = shared.addr_of(node) else { return PeerState::Unknown };
        match TcpStream::connect_timeout(&addr, shared.op_timeout) {
            Ok(probe) => {
                let _ = probe.shutdown(Shutdown::Both);
                PeerState::Running
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => PeerState::Gone,
            Err(_) => PeerState::Unknown,
        }
    }
}

impl UcxFabric {
    fn submitter(&self) -> Result<&Arc<Submitter>> {
        self.shared.submitter.get().ok_or(FabricError::Closed)
    }
}

/// Keeps a region's UCX memory mapped while its `RegionMemory` lives; the
/// last owner unmaps it through the progress thread, or directly once that
/// thread is gone.
struct Mapping {
    memh: usize,
    submitter: std::sync::Weak<Submitter>,
    context: Arc<Context>,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let queued = self.submitter.upgrade().is_some_and(|s| s.submit(Command::Unmap { memh: self.memh }).is_ok());
        if !queued {
            self.context.unmap(self.memh);
        }
    }
}

/// A handle to a region of a node's process, reached through UCX.
struct UcxRegion {
    shared: Arc<Shared>,
    link: Arc<PeerLink>,
    name: String,
    len: u64,
    base: u64,
    /// What the owner allows this node (the mapping's protection enforces
    /// the widest rights any peer has; this, the rest).
    rights: Rights,
    rkey: u64,
}

impl UcxRegion {
    fn try_post(&self, ops: Vec<Op>) -> Result<Completion> {
        self.shared.check_open()?;
        self.link.check()?;
        check_batch(&self.name, self.len, &ops)?;
        if let Some(op) = ops.iter().find(|op| !self.rights.contains(op.needs())) {
            return Err(FabricError::Forbidden {
                node: self.shared.node,
                region: self.name.clone(),
                needed: op.needs(),
                granted: self.rights,
            });
        }
        let (completion, sender) = Completion::pending_spinning(progress::CALLER_SPIN);
        self.shared.submit(Command::Post {
            node: self.link.node,
            generation: self.link.generation,
            rkey: self.rkey,
            base: self.base,
            ops,
            sender,
        })?;
        Ok(completion)
    }
}

impl RemoteRegion for UcxRegion {
    fn node(&self) -> NodeId {
        self.link.node
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn post(&self, ops: Vec<Op>) -> Completion {
        self.try_post(ops).unwrap_or_else(|error| Completion::ready(Err(error)))
    }
}

impl Drop for UcxRegion {
    fn drop(&mut self) {
        let _ = self.shared.submit(Command::DestroyRkey { id: self.rkey });
    }
}

/// What every send checks first: the fabric is open, the message fits a
/// transfer, and the node id is one a topology can name.
fn check_message(shared: &Shared, to: NodeId, payload: &[u8]) -> Result<()> {
    shared.check_open()?;
    if payload.len() > TRANSFER_BYTES_MAX {
        return Err(FabricError::TransferTooLarge { len: payload.len() });
    }
    if to.0 >= NODES_MAX {
        return Err(FabricError::UnknownNode { node: to });
    }
    Ok(())
}
