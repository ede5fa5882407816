//! The `ucx` fabric backend: tierstack's one-sided operations and messages
//! through UCX (OpenUCX), so one cluster description runs on InfiniBand,
//! RoCE, shared memory or TCP, whatever UCX finds (`UCX_TLS` chooses).
//!
//! Main types: [`UcxFabric`] (one per node; implements
//! [`tierstack_fabric::Fabric`]) built from a [`UcxConfig`]. No UCX type
//! leaks out of this crate; the raw bindings are `tierstack-ucx-sys`.
//!
//! **Regions** are allocated by UCX itself (`ucp_mem_map` with
//! `UCP_MEM_MAP_ALLOCATE`): with memory the application allocated, UCX
//! 1.13's shared-memory transports fall back to software emulation that
//! needs the owner's CPU; with memory UCX allocated they map it into the
//! peer and the owner never runs. The owner accesses its regions through
//! [`tierstack_fabric::RegionMemory`] as on every backend.
//!
//! **Connecting** uses a small TCP bootstrap on the node's topology address
//! ([`bootstrap`], `docs/wire-format.md`): a `HELLO` exchanges worker
//! addresses (both sides then have an endpoint to the other, flushed — so
//! wired up — before the hello completes), a `LOOKUP`
//! returns a region's length, base address and packed remote key. The hello
//! connection stays open as the liveness watch: when it breaks, or the
//! other side says `BYE` as it closes its node, the peer is dead for every
//! handle (`PeerDead`, [`tierstack_fabric::PeerState::Gone`]), which is how
//! a closed owner's regions are revoked here (UCX's shared-memory keys stay
//! valid after their owner exits). UCX's own endpoint errors
//! (`UCP_ERR_HANDLING_MODE_PEER`) do the same.
//!
//! **One progress thread per node owns the UCX worker**
//! (`UCS_THREAD_MODE_SINGLE`: no other thread calls into the worker).
//! Callers validate a batch, then submit it through a queue and wake the
//! thread with an eventfd. The thread's loop is UCX's documented idle
//! discipline, which has no lost wake-up: progress until the worker has
//! nothing to do, handle what the callbacks recorded, drain the submit
//! queue, then `ucp_worker_arm` (on `UCS_ERR_BUSY`: progress again) and
//! `poll` on the worker's event fd *and* the submit eventfd, bounded by the
//! nearest deadline. Before it arms, an idle thread polls the worker and the
//! queue for a bounded, adaptive while (50 µs, halving towards 2 µs each
//! time it finds nothing, doubling back when it does), and a submitter
//! writes the eventfd only when the thread said it sleeps (a flag set, a
//! SeqCst fence, then a last look at the queue; the submitter queues,
//! fences, then reads the flag: no wake-up is lost). Every result travels
//! to its waiter through a bounded flume channel (a oneshot: sending before
//! the waiter waits is fine); a caller waiting for a batch polls it for
//! 20 µs before it parks, so a fast operation costs no thread wake-up.
//! Both polls yield the CPU between looks (`sched_yield`), so a caller and
//! a progress thread pinned to one CPU hand over instead of starving each
//! other.
//!
//! **A batch** is posted as its ops (`ucp_put_nbx`, `ucp_get_nbx`,
//! `ucp_atomic_op_nbx` fetch-add and compare-swap) separated by
//! `ucp_worker_fence` (ops execute in order), then one `ucp_ep_flush_nbx`
//! whose callback completes the whole batch. A batch past the op timeout
//! completes with `Timeout`; its buffers live until UCX lets go of them.
//! A `ReadInto` lands in a bounce buffer and is copied into its target only
//! when the batch succeeds, so a late answer never writes into the target.
//!
//! **Messages** are UCX active messages, forced eager, whose header names
//! the channel, the sender and a message id. The receiver's progress thread
//! copies the payload and puts it straight into the channel's inbox; if the
//! inbox is full (or earlier messages of the channel still wait) a per-channel
//! delivery thread waits for room instead. The receiver acknowledges a
//! message (an `ACK` active message) once it is in the inbox, and `send`
//! returns only then (or fails with `Timeout` / `PeerDead`): so a full inbox
//! holds the sender back and nothing is dropped, and one thread's messages
//! arrive in send order without relying on UCX's ordering of active
//! messages. The price is a round trip per message.
//!
//! Built without UCX (see `tierstack-ucx-sys`), [`UcxFabric::open`] fails
//! with a clear error and nothing else changes.

pub mod bootstrap;

#[cfg(ucx_available)]
mod imp;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;
use tierstack_base::NodeId;

#[cfg(ucx_available)]
pub use imp::UcxFabric;

/// Whether this build has the UCX backend (UCX and libclang were found).
pub const AVAILABLE: bool = cfg!(ucx_available);

/// The error text when the backend was built without UCX.
pub fn unavailable_reason() -> String {
    format!(
        "the ucx fabric backend was built without UCX ({}): install libucx-dev libclang-dev and rebuild",
        tierstack_ucx_sys::UNAVAILABLE_REASON.trim()
    )
}

/// Configuration of one node's [`UcxFabric`].
#[derive(Clone, Debug)]
pub struct UcxConfig {
    pub node: NodeId,
    /// The bootstrap listener's address (the node's topology address); port
    /// 0 picks a free port ([`UcxFabric::local_addr`]).
    pub listen: SocketAddr,
    /// Where the other nodes' bootstrap listeners are.
    pub peers: HashMap<NodeId, SocketAddr>,
    /// How long an operation batch, a message send (until its
    /// acknowledgement) or a bootstrap exchange may take.
    pub op_timeout: Duration,
    /// UCX transports (`UCX_TLS`), such as `"sysv,self"` or `"tcp,self"`;
    /// `None` leaves UCX's own choice (and the `UCX_TLS` environment variable).
    pub transports: Option<String>,
    /// The cluster's key: with it, every bootstrap connection is mutually
    /// authenticated and its frames sealed, so worker addresses and remote
    /// keys go only to peers that hold it ([`bootstrap`]).
    pub key: Option<tierstack_fabric_wire::auth::FabricKey>,
}

impl UcxConfig {
    pub const OP_TIMEOUT_DEFAULT: Duration = Duration::from_millis(1000);

    pub fn new(node: NodeId, listen: SocketAddr) -> Self {
        Self { node, listen, peers: HashMap::new(), op_timeout: Self::OP_TIMEOUT_DEFAULT, transports: None, key: None }
    }

    /// Authenticates every bootstrap connection with `key`.
    pub fn with_key(mut self, key: &tierstack_secret::ClusterKey) -> Self {
        self.key = Some(tierstack_fabric_wire::auth::FabricKey::new(key));
        self
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

    pub fn with_transports(mut self, transports: impl Into<String>) -> Self {
        self.transports = Some(transports.into());
        self
    }
}

/// The stand-in built without UCX: opening it fails with a clear error.
#[cfg(not(ucx_available))]
pub struct UcxFabric(std::convert::Infallible);

#[cfg(not(ucx_available))]
impl UcxFabric {
    /// Fails: this build has no UCX ([`unavailable_reason`]).
    pub fn open(_config: UcxConfig) -> tierstack_fabric::Result<std::sync::Arc<UcxFabric>> {
        Err(tierstack_fabric::FabricError::Io(unavailable_reason()))
    }

    pub fn local_addr(&self) -> SocketAddr {
        match self.0 {}
    }

    pub fn add_peer(&self, _node: NodeId, _addr: SocketAddr) {
        match self.0 {}
    }

    pub fn shutdown(&self) {
        match self.0 {}
    }
}

#[cfg(not(ucx_available))]
impl tierstack_fabric::Fabric for UcxFabric {
    fn local_node(&self) -> NodeId {
        match self.0 {}
    }
    fn backend_name(&self) -> &'static str {
        "ucx"
    }
    fn register(
        &self,
        _: &str,
        _: u64,
        _: tierstack_fabric::Access,
    ) -> tierstack_fabric::Result<std::sync::Arc<tierstack_fabric::LocalRegion>> {
        match self.0 {}
    }
    fn connect(
        &self,
        _: NodeId,
        _: &str,
    ) -> tierstack_fabric::Result<std::sync::Arc<dyn tierstack_fabric::RemoteRegion>> {
        match self.0 {}
    }
    fn send(&self, _: NodeId, _: tierstack_fabric::Channel, _: &[u8]) -> tierstack_fabric::Result<()> {
        match self.0 {}
    }
    fn try_send(
        &self,
        _: NodeId,
        _: tierstack_fabric::Channel,
        _: &[u8],
    ) -> tierstack_fabric::Result<tierstack_fabric::TrySend> {
        match self.0 {}
    }
    fn inbox(&self, _: tierstack_fabric::Channel) -> &tierstack_fabric::Inbox {
        match self.0 {}
    }
    fn peer_state(&self, _: NodeId) -> tierstack_fabric::PeerState {
        match self.0 {}
    }
}
