//! The cluster description and the one place that picks a fabric backend.
//!
//! A cluster is described by a TOML topology file:
//!
//! ```toml
//! [cluster]
//! name = "demo"            # names the shm directory
//! fabric = "shm"           # shm | tcp | ucx: every node uses the same backend
//! op_timeout_ms = 1000     # bound on a remote operation (tcp) or a message send
//! shm_receive_spin_us = 50 # optional, shm: how long a receiver polls before it sleeps
//! ucx_transports = "sysv,self" # optional, ucx: UCX_TLS for every node (default: UCX's choice)
//! key_file = "cluster.key" # tcp, ucx: the cluster key (`tierstack cluster key --out FILE`),
//!                          # relative to this file; required unless every address is loopback
//! tls = true               # tcp, optional: every connection inside TLS too (needs key_file)
//!
//! [[node]]
//! id = 0
//! role = "app"             # proxy | app | db | passive
//! address = "127.0.0.1:7400"   # tcp: where the node's responder listens; ucx: its bootstrap
//! cpu = 1                  # optional: pin the node's process to this CPU
//!
//! [node.service]           # optional: what `tierstack cluster up` runs as this node
//! kind = "app-module"      # app-module | app-server | proxy | origin | press-node
//!                          # | dlm-node | ddss-daemon | coop-node
//! socket = "/run/tierstack/module.sock"  # app-module: its local socket
//! metrics = "127.0.0.1:9400"             # optional: /metrics, /healthz, /readyz
//! ```
//!
//! **Services** (optional, added after the fabric fields; a topology without
//! them means what it always did). A node's `[node.service]` names the tier
//! process `tierstack cluster up` starts for it on this host, and that
//! process's options ([`ServiceSpec`]):
//!
//! - `app-module`: `socket` (its local socket, for the application servers).
//! - `app-server`: `listen` (HTTP, also its `/healthz` and `/readyz`),
//!   `module` (the node id of its `app-module`, on the same host: it uses
//!   that node's socket).
//! - `proxy`: `listen` (clients), `admin` (pushes, stats, `/metrics`,
//!   `/healthz`, `/readyz`), `upstreams` (node ids of `app-server` nodes),
//!   optionally `mode` (`poll`, the default, `ttl` or `no-cache`).
//! - `origin`: `listen`, optionally `admin` (its stats, `/metrics`,
//!   `/healthz`, `/readyz`). Opens no fabric node.
//! - `press-node`: `listen` (clients), optionally `admin`.
//! - `dlm-node`, `coop-node`: nothing beyond `args` (`dlm-node` needs
//!   `--locks`, `coop-node` `--scheme`).
//! - `ddss-daemon`: `socket` (its local socket, for client processes).
//!
//! Every kind but the proxy and the origin (whose `admin` serves them)
//! takes `metrics`: the address of its `/metrics`, `/healthz` and
//! `/readyz` (`--metrics-listen`).
//!
//! Every kind also takes `args`, further options of its `tierstack`
//! subcommand appended verbatim (`["--cache-bytes", "1000000"]`, `["--docs", "50"]`).
//! [`Topology::parse`] checks that each reference names a node of the right
//! kind and that no two services share a listener.
//!
//! **The cluster key.** With `key_file`, the tcp and ucx backends
//! authenticate every connection both ways and (tcp) seal every frame; the
//! file must be private to its owner (`tierstack_secret::read_secret_file`).
//! Without one, nodes take each other at their word, which is safe only
//! where nobody else can reach them: a topology with a non-loopback address
//! and no key is refused, and a keyless tcp or ucx node logs a warning.
//! The shm backend stays on one host and needs no key (see `docs/security.md`).
//!
//! [`Topology::parse`] validates everything a node needs before it starts
//! (duplicate ids or addresses, unknown roles, bad addresses, missing tcp
//! addresses) and reports it with the offending node. [`open_fabric`] turns a
//! validated topology into the node's `Arc<dyn Fabric>`; services above never
//! see which backend they run on. [`local_cluster`] builds N nodes inside one
//! process for tests and benchmarks.
//! [`NodeArgs`] (`--topology FILE --node ID`) are the flags by which a
//! process names its node, shared by every tier and tool that attaches.

mod args;

pub use args::{open_node, NodeArgs, NodeOpenError};
use serde::Deserialize;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::limits::NODES_MAX;
use tierstack_base::NodeId;
use tierstack_fabric::{Fabric, FabricError};
use tierstack_fabric_shm::{ShmConfig, ShmFabric};
use tierstack_fabric_tcp::{TcpConfig, TcpFabric};
use tierstack_fabric_ucx::{UcxConfig, UcxFabric};
pub use tierstack_secret::{ClusterKey, SecretError};

/// Which fabric backend a cluster runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Shared-memory files on one host: one-sided operations never need the owner's CPU.
    Shm,
    /// A responder thread on the owner answers every operation: the two-sided baseline.
    Tcp,
    /// UCX (`tierstack-fabric-ucx`): RDMA where there is a NIC, shared
    /// memory or TCP otherwise, as `UCX_TLS` / `ucx_transports` choose.
    Ucx,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Shm => "shm",
            Backend::Tcp => "tcp",
            Backend::Ucx => "ucx",
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "shm" => Ok(Backend::Shm),
            "tcp" => Ok(Backend::Tcp),
            "ucx" => Ok(Backend::Ucx),
            other => Err(format!("unknown fabric backend {other:?} (expected shm, tcp or ucx)")),
        }
    }
}

/// A node's job in the data-center.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Proxy,
    App,
    Db,
    Passive,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    pub name: String,
    pub fabric: Backend,
    #[serde(default = "default_op_timeout_ms")]
    pub op_timeout_ms: u64,
    /// Root directory of the shm backend; default per user,
    /// `/dev/shm/tierstack-<uid>/<name>`. Created 0700 if missing; refused
    /// if a symbolic link, another user's, or writable by others.
    #[serde(default)]
    pub shm_root: Option<PathBuf>,
    /// shm: how long a thread waiting for a message polls before it sleeps
    /// (`ShmConfig::receive_spin`); default the backend's.
    #[serde(default)]
    pub shm_receive_spin_us: Option<u64>,
    /// ucx: the UCX transports (`UCX_TLS`) every node uses, such as
    /// `"sysv,self"`; default: UCX's own choice and the environment.
    #[serde(default)]
    pub ucx_transports: Option<String>,
    /// tcp, ucx: the cluster key's file; a relative path is relative to the
    /// topology file's directory ([`Topology::load`]).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// tcp: every connection inside TLS 1.3 as well (needs `key_file`), for
    /// cluster networks that are not private.
    #[serde(default)]
    pub tls: bool,
}

fn default_op_timeout_ms() -> u64 {
    1000
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    pub id: NodeId,
    pub role: Role,
    #[serde(default)]
    pub address: Option<SocketAddr>,
    #[serde(default)]
    pub cpu: Option<usize>,
    /// The tier process `tierstack cluster up` runs as this node, if any.
    #[serde(default)]
    pub service: Option<ServiceSpec>,
}

/// Which `tierstack` tier command a node's service runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServiceKind {
    AppModule,
    AppServer,
    Proxy,
    Origin,
    PressNode,
    DlmNode,
    DdssDaemon,
    CoopNode,
}

/// Whether a kind of service takes a field of `[node.service]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Required,
    Optional,
    Refused,
}

/// The fields a kind takes (see [`ServiceKind::fields`]).
#[derive(Clone, Copy, Debug)]
pub struct ServiceFields {
    pub listen: Field,
    pub admin: Field,
    pub socket: Field,
    pub module: Field,
    pub upstreams: Field,
    pub mode: Field,
    pub metrics: Field,
}

impl ServiceKind {
    /// Every kind, in the order `cluster up` starts them: what others need
    /// first (the module before its server, the substrates and lock
    /// managers before what may use them), the front ends last.
    pub const START_ORDER: [ServiceKind; 8] = [
        ServiceKind::AppModule,
        ServiceKind::DdssDaemon,
        ServiceKind::DlmNode,
        ServiceKind::CoopNode,
        ServiceKind::Origin,
        ServiceKind::AppServer,
        ServiceKind::PressNode,
        ServiceKind::Proxy,
    ];

    /// The `tierstack` subcommand.
    pub fn command(self) -> &'static str {
        match self {
            ServiceKind::AppModule => "app-module",
            ServiceKind::AppServer => "app-server",
            ServiceKind::Proxy => "proxy",
            ServiceKind::Origin => "origin",
            ServiceKind::PressNode => "press-node",
            ServiceKind::DlmNode => "dlm-node",
            ServiceKind::DdssDaemon => "ddss-daemon",
            ServiceKind::CoopNode => "coop-node",
        }
    }

    /// Which `[node.service]` fields the kind needs, may take, or refuses.
    /// The proxy and the origin serve `/metrics` on their `admin` listener,
    /// so they take no `metrics` address.
    pub fn fields(self) -> ServiceFields {
        use Field::{Optional as O, Refused as R, Required as Q};
        let fields = |listen, admin, socket, module, upstreams, mode, metrics| ServiceFields {
            listen,
            admin,
            socket,
            module,
            upstreams,
            mode,
            metrics,
        };
        match self {
            ServiceKind::AppModule => fields(R, R, Q, R, R, R, O),
            ServiceKind::AppServer => fields(Q, R, R, Q, R, R, O),
            ServiceKind::Proxy => fields(Q, Q, R, R, Q, O, R),
            ServiceKind::Origin => fields(Q, O, R, R, R, R, R),
            ServiceKind::PressNode => fields(Q, O, R, R, R, R, O),
            ServiceKind::DlmNode | ServiceKind::CoopNode => fields(R, R, R, R, R, R, O),
            ServiceKind::DdssDaemon => fields(R, R, Q, R, R, R, O),
        }
    }

    /// Whether the kind is ready only once its peers run (every lock
    /// server, substrate, PRESS or cooperative-cache node of the topology):
    /// started in order, such a service could not be ready before the
    /// next one starts, so a launcher waits for its readiness only once
    /// every service has started.
    pub fn ready_with_peers(self) -> bool {
        matches!(self, ServiceKind::DlmNode | ServiceKind::DdssDaemon | ServiceKind::PressNode | ServiceKind::CoopNode)
    }

    /// Whether the kind opens a fabric node (and so takes `--topology`/`--node`).
    pub fn opens_fabric_node(self) -> bool {
        self != ServiceKind::Origin
    }
}

/// A node's `[node.service]`: see the module documentation.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    pub kind: ServiceKind,
    /// app-server, proxy: the HTTP listener.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// proxy: the admin listener.
    #[serde(default)]
    pub admin: Option<SocketAddr>,
    /// app-module: its local socket.
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// app-server: the node of its app-module.
    #[serde(default)]
    pub module: Option<NodeId>,
    /// proxy: the app-server nodes it forwards to.
    #[serde(default)]
    pub upstreams: Vec<NodeId>,
    /// proxy: its cache mode (`poll` when absent).
    #[serde(default)]
    pub mode: Option<String>,
    /// Where `/metrics`, `/healthz` and `/readyz` answer (`--metrics-listen`)
    /// for the kinds without an admin listener (optional).
    #[serde(default)]
    pub metrics: Option<SocketAddr>,
    /// Further options of the subcommand, appended verbatim.
    #[serde(default)]
    pub args: Vec<String>,
}

/// A validated cluster description.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    pub cluster: ClusterSection,
    #[serde(rename = "node")]
    pub nodes: Vec<NodeSpec>,
}

/// What is wrong with a topology.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("cannot read topology file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("topology is not valid TOML for tierstack: {0}")]
    Syntax(String),
    #[error("the topology names no nodes")]
    NoNodes,
    #[error("node id {0} appears more than once")]
    DuplicateId(NodeId),
    #[error("node id {id} is too large (ids must be below {max})")]
    IdTooLarge { id: NodeId, max: u32 },
    #[error("{node} has no address, which the tcp and ucx fabrics need")]
    MissingAddress { node: NodeId },
    #[error("{node} and {other} share the address {address}")]
    DuplicateAddress { node: NodeId, other: NodeId, address: SocketAddr },
    #[error("op_timeout_ms must be between 1 and 600000, got {0}")]
    BadTimeout(u64),
    #[error("cluster name {0:?} must be 1-64 characters of letters, digits, '-' or '_'")]
    BadName(String),
    #[error("{node} is not in the topology")]
    UnknownNode { node: NodeId },
    #[error("{node}'s {kind} service needs `{field}`")]
    ServiceMissing { node: NodeId, kind: &'static str, field: &'static str },
    #[error("{node}'s service: `{field}` does not apply to {kind}")]
    ServiceExtra { node: NodeId, kind: &'static str, field: &'static str },
    #[error("{node}'s service refers to {other}, which runs no {expected} service")]
    ServiceReference { node: NodeId, other: NodeId, expected: &'static str },
    #[error("{node} and {other} both listen on {address}")]
    ServiceAddress { node: NodeId, other: NodeId, address: SocketAddr },
    #[error(
        "{node}'s address {address} is not loopback, and the cluster has no key: anyone who reaches it could act as \
         any node. Make one with `tierstack cluster key --out cluster.key` and name it in [cluster] key_file"
    )]
    KeyRequired { node: NodeId, address: SocketAddr },
    #[error("tls = true needs the tcp fabric and a key_file (the key, not a certificate, proves who a node is)")]
    TlsNeedsTcpAndKey,
}

impl Topology {
    /// Parses and validates a topology from TOML text.
    pub fn parse(text: &str) -> Result<Topology, TopologyError> {
        let topology: Topology = toml::from_str(text).map_err(|e| TopologyError::Syntax(e.to_string()))?;
        topology.validate()?;
        Ok(topology)
    }

    /// Reads, parses and validates a topology file. A relative `key_file`,
    /// `shm_root` or service `socket` is taken relative to the file's
    /// directory (so a topology and its files can move together).
    pub fn load(path: &Path) -> Result<Topology, TopologyError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| TopologyError::Read { path: path.to_path_buf(), source })?;
        let mut topology = Topology::parse(&text)?;
        let Some(dir) = path.parent() else { return Ok(topology) };
        let beside = |file: &mut PathBuf| {
            if file.is_relative() {
                *file = dir.join(&*file);
            }
        };
        topology.cluster.key_file.iter_mut().for_each(beside);
        topology.cluster.shm_root.iter_mut().for_each(beside);
        for node in &mut topology.nodes {
            node.service.iter_mut().flat_map(|s| s.socket.iter_mut()).for_each(beside);
        }
        Ok(topology)
    }

    /// Reads the cluster key, if the topology names one.
    pub fn key(&self) -> Result<Option<ClusterKey>, SecretError> {
        self.cluster.key_file.as_deref().map(ClusterKey::read).transpose()
    }

    fn validate(&self) -> Result<(), TopologyError> {
        let name = &self.cluster.name;
        if name.is_empty()
            || name.len() > 64
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(TopologyError::BadName(name.clone()));
        }
        if self.cluster.op_timeout_ms == 0 || self.cluster.op_timeout_ms > 600_000 {
            return Err(TopologyError::BadTimeout(self.cluster.op_timeout_ms));
        }
        if self.nodes.is_empty() {
            return Err(TopologyError::NoNodes);
        }
        if self.cluster.tls && (self.cluster.fabric != Backend::Tcp || self.cluster.key_file.is_none()) {
            return Err(TopologyError::TlsNeedsTcpAndKey);
        }
        let mut ids = HashSet::new();
        let mut addresses: Vec<(SocketAddr, NodeId)> = Vec::new();
        for node in &self.nodes {
            if node.id.0 >= NODES_MAX {
                return Err(TopologyError::IdTooLarge { id: node.id, max: NODES_MAX });
            }
            if !ids.insert(node.id) {
                return Err(TopologyError::DuplicateId(node.id));
            }
            match node.address {
                Some(address) => {
                    if let Some((_, other)) = addresses.iter().find(|(a, _)| *a == address) {
                        return Err(TopologyError::DuplicateAddress { node: node.id, other: *other, address });
                    }
                    addresses.push((address, node.id));
                }
                None if matches!(self.cluster.fabric, Backend::Tcp | Backend::Ucx) => {
                    return Err(TopologyError::MissingAddress { node: node.id })
                }
                None => {}
            }
            if let Some(address) = node.address {
                let networked = matches!(self.cluster.fabric, Backend::Tcp | Backend::Ucx);
                if networked && self.cluster.key_file.is_none() && !address.ip().is_loopback() {
                    return Err(TopologyError::KeyRequired { node: node.id, address });
                }
            }
        }
        self.validate_services()
    }

    /// The `[node.service]` sections: each kind has what it needs and
    /// nothing it ignores, references name nodes of the right kind, and no
    /// two listeners share an address.
    fn validate_services(&self) -> Result<(), TopologyError> {
        let kind_of =
            |id: NodeId| self.nodes.iter().find(|n| n.id == id).and_then(|n| n.service.as_ref()).map(|s| s.kind);
        let mut listeners: Vec<(SocketAddr, NodeId)> = Vec::new();
        for node in &self.nodes {
            let Some(service) = &node.service else { continue };
            let (id, kind) = (node.id, service.kind.command());
            let missing = |field| TopologyError::ServiceMissing { node: id, kind, field };
            let extra = |field| TopologyError::ServiceExtra { node: id, kind, field };
            let fields = service.kind.fields();
            for (field, present, name) in [
                (fields.listen, service.listen.is_some(), "listen"),
                (fields.admin, service.admin.is_some(), "admin"),
                (fields.socket, service.socket.is_some(), "socket"),
                (fields.module, service.module.is_some(), "module"),
                (fields.upstreams, !service.upstreams.is_empty(), "upstreams"),
                (fields.mode, service.mode.is_some(), "mode"),
                (fields.metrics, service.metrics.is_some(), "metrics"),
            ] {
                match (field, present) {
                    (Field::Required, false) => return Err(missing(name)),
                    (Field::Refused, true) => return Err(extra(name)),
                    _ => {}
                }
            }
            let references = service.module.iter().map(|m| (*m, ServiceKind::AppModule));
            let references = references.chain(service.upstreams.iter().map(|u| (*u, ServiceKind::AppServer)));
            for (other, expected) in references {
                if kind_of(other) != Some(expected) {
                    return Err(TopologyError::ServiceReference { node: id, other, expected: expected.command() });
                }
            }
            for address in service.listen.iter().chain(service.admin.iter()).chain(service.metrics.iter()) {
                if let Some((_, other)) = listeners.iter().find(|(a, _)| a == address) {
                    return Err(TopologyError::ServiceAddress { node: id, other: *other, address: *address });
                }
                listeners.push((*address, id));
            }
        }
        Ok(())
    }

    /// The nodes with a `[node.service]`, in file order.
    pub fn services(&self) -> impl Iterator<Item = (&NodeSpec, &ServiceSpec)> {
        self.nodes.iter().filter_map(|n| n.service.as_ref().map(|s| (n, s)))
    }

    pub fn node(&self, id: NodeId) -> Result<&NodeSpec, TopologyError> {
        self.nodes.iter().find(|n| n.id == id).ok_or(TopologyError::UnknownNode { node: id })
    }

    pub fn node_ids(&self) -> Vec<NodeId> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// The ids of nodes with `role`, in file order.
    pub fn nodes_with_role(&self, role: Role) -> Vec<NodeId> {
        self.nodes.iter().filter(|n| n.role == role).map(|n| n.id).collect()
    }

    pub fn op_timeout(&self) -> Duration {
        Duration::from_millis(self.cluster.op_timeout_ms)
    }

    /// The shm root directory for this cluster.
    pub fn shm_root(&self) -> PathBuf {
        self.cluster.shm_root.clone().unwrap_or_else(|| tierstack_fabric_shm::default_root(&self.cluster.name))
    }
}

/// Opens `node`'s attachment to the fabric the topology names.
pub fn open_fabric(topology: &Topology, node: NodeId) -> Result<Arc<dyn Fabric>, OpenError> {
    let spec = topology.node(node)?;
    let key = match topology.cluster.fabric {
        Backend::Shm => None,
        Backend::Tcp | Backend::Ucx => topology.key()?,
    };
    if key.is_none() && topology.cluster.fabric != Backend::Shm {
        tracing::warn!(
            %node,
            "the cluster has no key: peers are taken at their word, which is safe on loopback only \
             (make one with `tierstack cluster key --out FILE`, name it in [cluster] key_file)"
        );
    }
    match topology.cluster.fabric {
        Backend::Shm => {
            let mut config = ShmConfig::new(topology.shm_root(), node)
                .with_nodes(topology.node_ids())
                .with_send_timeout(topology.op_timeout());
            if let Some(spin_us) = topology.cluster.shm_receive_spin_us {
                config = config.with_receive_spin(Duration::from_micros(spin_us));
            }
            Ok(ShmFabric::open(config)?)
        }
        Backend::Tcp => {
            let listen = spec.address.ok_or(TopologyError::MissingAddress { node })?;
            let mut config = TcpConfig::new(node, listen).with_op_timeout(topology.op_timeout());
            if let Some(key) = &key {
                config = config.with_key(key);
            }
            if topology.cluster.tls {
                config = config.with_tls();
            }
            for peer in &topology.nodes {
                if let Some(address) = peer.address {
                    config = config.with_peer(peer.id, address);
                }
            }
            Ok(TcpFabric::open(config)?)
        }
        Backend::Ucx => {
            let listen = spec.address.ok_or(TopologyError::MissingAddress { node })?;
            let mut config = UcxConfig::new(node, listen).with_op_timeout(topology.op_timeout());
            if let Some(key) = &key {
                config = config.with_key(key);
            }
            if let Some(transports) = &topology.cluster.ucx_transports {
                config = config.with_transports(transports.clone());
            }
            for peer in &topology.nodes {
                if let Some(address) = peer.address {
                    config = config.with_peer(peer.id, address);
                }
            }
            Ok(UcxFabric::open(config)?)
        }
    }
}

/// Why a node could not attach to its fabric.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error(transparent)]
    Key(#[from] SecretError),
}

/// CPUs online on this machine, whatever this process's affinity mask says
/// (`available_parallelism` shrinks once a process is pinned, which would
/// make a pinned launcher think its children have only one CPU).
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).ok().filter(|n| *n > 0).unwrap_or(1)
}

/// Pins the calling thread (and the threads it starts afterwards) to `cpu`.
pub fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    let cpus = online_cpus();
    if cpu >= cpus || cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("cpu {cpu} does not exist (this machine has {cpus})"),
        ));
    }
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write within it, and
    // sched_setaffinity reads exactly size_of::<cpu_set_t>() bytes of it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// N nodes of one backend inside this process, for tests and benchmarks.
pub struct LocalCluster {
    fabrics: Vec<Arc<dyn Fabric>>,
    // Keeps the shm root alive for the cluster's lifetime.
    _root: Option<tempfile::TempDir>,
}

impl LocalCluster {
    pub fn fabrics(&self) -> &[Arc<dyn Fabric>] {
        &self.fabrics
    }

    pub fn fabric(&self, index: usize) -> &Arc<dyn Fabric> {
        &self.fabrics[index]
    }
}

/// Starts `nodes` nodes (ids 0..nodes) on `backend` in this process.
pub fn local_cluster(backend: Backend, nodes: u32) -> Result<LocalCluster, FabricError> {
    local_cluster_with_timeout(backend, nodes, Duration::from_millis(1000))
}

/// As [`local_cluster`], with an explicit operation timeout.
pub fn local_cluster_with_timeout(
    backend: Backend,
    nodes: u32,
    op_timeout: Duration,
) -> Result<LocalCluster, FabricError> {
    match backend {
        Backend::Shm => {
            let root = tempfile::Builder::new().prefix("tierstack-").tempdir()?;
            let ids: Vec<NodeId> = (0..nodes).map(NodeId).collect();
            let fabrics = ids
                .iter()
                .map(|id| {
                    let config = ShmConfig::new(root.path(), *id).with_nodes(ids.clone()).with_send_timeout(op_timeout);
                    ShmFabric::open(config).map(|f| f as Arc<dyn Fabric>)
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(LocalCluster { fabrics, _root: Some(root) })
        }
        Backend::Tcp => {
            let loopback: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 0));
            let tcp: Vec<Arc<TcpFabric>> = (0..nodes)
                .map(|id| TcpFabric::open(TcpConfig::new(NodeId(id), loopback).with_op_timeout(op_timeout)))
                .collect::<Result<_, _>>()?;
            for fabric in &tcp {
                for (peer, other) in tcp.iter().enumerate() {
                    fabric.add_peer(NodeId(peer as u32), other.local_addr());
                }
            }
            Ok(LocalCluster { fabrics: tcp.into_iter().map(|f| f as Arc<dyn Fabric>).collect(), _root: None })
        }
        Backend::Ucx => local_ucx_cluster(nodes, op_timeout, None),
    }
}

/// `nodes` ucx nodes in this process over `transports` (`UCX_TLS`; `None`:
/// [`LOCAL_UCX_TRANSPORTS`] unless `UCX_TLS` is set). Fails with the
/// backend's error when this build has no UCX.
pub fn local_ucx_cluster(
    nodes: u32,
    op_timeout: Duration,
    transports: Option<&str>,
) -> Result<LocalCluster, FabricError> {
    let loopback: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 0));
    let transports = transports
        .map(str::to_string)
        .or_else(|| std::env::var("UCX_TLS").is_err().then(|| LOCAL_UCX_TRANSPORTS.to_string()));
    let ucx: Vec<Arc<UcxFabric>> = (0..nodes)
        .map(|id| {
            let mut config = UcxConfig::new(NodeId(id), loopback).with_op_timeout(op_timeout);
            if let Some(transports) = &transports {
                config = config.with_transports(transports.clone());
            }
            UcxFabric::open(config)
        })
        .collect::<Result<_, _>>()?;
    for fabric in &ucx {
        for (peer, other) in ucx.iter().enumerate() {
            fabric.add_peer(NodeId(peer as u32), other.local_addr());
        }
    }
    Ok(LocalCluster { fabrics: ucx.into_iter().map(|f| f as Arc<dyn Fabric>).collect(), _root: None })
}

/// The UCX transports of in-process ucx clusters: shared memory, so the
/// one-sided operations really are one-sided.
pub const LOCAL_UCX_TRANSPORTS: &str = "sysv,self";

/// Whether this build has the ucx backend (UCX and libclang were found at
/// build time); tests of `Backend::Ucx` skip, saying why, when it has not.
pub fn ucx_available() -> bool {
    tierstack_fabric_ucx::AVAILABLE
}

/// Why this build has no ucx backend (empty when it has one).
pub fn ucx_unavailable_reason() -> String {
    if ucx_available() {
        String::new()
    } else {
        tierstack_fabric_ucx::unavailable_reason()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[cluster]
name = "t1"
fabric = "tcp"

[[node]]
id = 0
role = "app"
address = "127.0.0.1:7400"

[[node]]
id = 1
role = "proxy"
address = "127.0.0.1:7401"
cpu = 0
"#;

    #[test]
    fn parses_a_good_topology() {
        let t = Topology::parse(GOOD).unwrap();
        assert_eq!(t.nodes.len(), 2);
        assert_eq!(t.nodes_with_role(Role::Proxy), vec![NodeId(1)]);
        assert_eq!(t.op_timeout(), Duration::from_millis(1000));
        assert_eq!(t.node(NodeId(1)).unwrap().cpu, Some(0));
    }

    fn err(text: &str) -> String {
        Topology::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn rejects_bad_topologies_with_clear_errors() {
        assert!(err(&GOOD.replace("id = 1", "id = 0")).contains("appears more than once"));
        assert!(err(&GOOD.replace("\"proxy\"", "\"bouncer\"")).contains("unknown variant `bouncer`"));
        assert!(err(&GOOD.replace("127.0.0.1:7401", "127.0.0.1:99999")).contains("invalid socket address"));
        assert!(err(&GOOD.replace("127.0.0.1:7401", "127.0.0.1:7400")).contains("share the address"));
        assert!(err(&GOOD.replace("address = \"127.0.0.1:7401\"\n", "")).contains("has no address"));
        assert!(err(&GOOD.replace("\"tcp\"", "\"carrier-pigeon\"")).contains("unknown variant"));
        assert!(err(&GOOD.replace("name = \"t1\"", "name = \"../etc\"")).contains("cluster name"));
        assert!(err(&GOOD.replace("id = 1", "id = 100000")).contains("too large"));
        assert!(err("node = []\n[cluster]\nname = \"x\"\nfabric = \"shm\"\n").contains("no nodes"));
        assert!(err(&GOOD.replace("cpu = 0", "gpu = 0")).contains("unknown field"));
    }

    #[test]
    fn shm_nodes_need_no_address() {
        let t =
            Topology::parse("[cluster]\nname = \"s\"\nfabric = \"shm\"\n[[node]]\nid = 3\nrole = \"db\"\n").unwrap();
        assert!(t.shm_root().ends_with("s"));
        // Per user: two users' clusters of one name never share a root.
        // SAFETY: geteuid has no preconditions.
        let per_user = format!("tierstack-{}", unsafe { libc::geteuid() });
        assert!(t.shm_root().parent().unwrap().ends_with(per_user), "{}", t.shm_root().display());
    }

    const SERVICES: &str = r#"
[cluster]
name = "svc"
fabric = "shm"

[[node]]
id = 0
role = "app"
[node.service]
kind = "app-module"
socket = "/tmp/m.sock"

[[node]]
id = 1
role = "app"
[node.service]
kind = "app-server"
listen = "127.0.0.1:7500"
module = 0
args = ["--docs", "5"]

[[node]]
id = 2
role = "proxy"
[node.service]
kind = "proxy"
listen = "127.0.0.1:7501"
admin = "127.0.0.1:7502"
upstreams = [1]

[[node]]
id = 3
role = "passive"
"#;

    #[test]
    fn parses_services_and_leaves_nodes_without_one_alone() {
        let t = Topology::parse(SERVICES).unwrap();
        let kinds: Vec<(u32, ServiceKind)> = t.services().map(|(n, s)| (n.id.0, s.kind)).collect();
        assert_eq!(kinds, vec![(0, ServiceKind::AppModule), (1, ServiceKind::AppServer), (2, ServiceKind::Proxy)]);
        let (_, server) = t.services().nth(1).unwrap();
        assert_eq!(server.module, Some(NodeId(0)));
        assert_eq!(server.args, vec!["--docs".to_string(), "5".to_string()]);
        assert!(t.node(NodeId(3)).unwrap().service.is_none());
        // The topologies written before services existed still parse.
        assert!(Topology::parse(GOOD).unwrap().services().next().is_none());
    }

    #[test]
    fn rejects_bad_services_with_clear_errors() {
        let e = |text: String| Topology::parse(&text).unwrap_err().to_string();
        assert!(e(SERVICES.replace("socket = \"/tmp/m.sock\"\n", "")).contains("needs `socket`"));
        assert!(e(SERVICES.replace("module = 0", "module = 2")).contains("runs no app-module"));
        assert!(e(SERVICES.replace("upstreams = [1]", "upstreams = [0]")).contains("runs no app-server"));
        assert!(e(SERVICES.replace("upstreams = [1]", "upstreams = []")).contains("needs `upstreams`"));
        assert!(e(SERVICES.replace("7502", "7500")).contains("both listen on"));
        assert!(e(SERVICES.replace("module = 0", "module = 0\nadmin = \"127.0.0.1:7600\"")).contains("does not apply"));
        assert!(e(SERVICES.replace("\"app-module\"", "\"mainframe\"")).contains("unknown variant"));
        assert!(e(SERVICES.replace("module = 0", "module = 0\nmode = \"ttl\"")).contains("`mode` does not apply"));
        // The proxy serves /metrics on its admin listener; a metrics address may not collide.
        let proxy_metrics = SERVICES.replace("upstreams = [1]", "upstreams = [1]\nmetrics = \"127.0.0.1:7600\"");
        assert!(e(proxy_metrics).contains("`metrics` does not apply to proxy"));
        let server_metrics = SERVICES.replace("module = 0", "module = 0\nmetrics = \"127.0.0.1:7501\"");
        assert!(e(server_metrics).contains("both listen on"));
        assert!(e(SERVICES.replace("kind = \"app-module\"", "kind = \"ddss-daemon\"")).contains("runs no app-module"));
    }

    #[test]
    fn the_shipped_one_machine_example_is_valid_and_local() {
        let t = Topology::parse(include_str!("../../../deploy/local.toml")).unwrap();
        assert_eq!(t.cluster.fabric, Backend::Shm);
        let addresses: Vec<SocketAddr> =
            t.services().flat_map(|(_, s)| s.listen.into_iter().chain(s.admin).chain(s.metrics)).collect();
        assert_eq!(addresses.len(), 7, "one module, one server, two proxies: {addresses:?}");
        assert!(addresses.iter().all(|a| a.ip().is_loopback()), "nothing listens beyond this machine");
    }

    #[test]
    fn the_shipped_multi_host_example_is_valid() {
        let t = Topology::parse(include_str!("../../../deploy/cluster.toml")).unwrap();
        assert_eq!(t.cluster.fabric, Backend::Tcp);
        assert!(t.services().count() >= 4);
        assert!(t.cluster.key_file.is_some(), "the multi-host example must name a cluster key");
    }

    const NETWORKED: &str =
        "[cluster]\nname = \"n\"\nfabric = \"tcp\"\n\n[[node]]\nid = 0\nrole = \"app\"\naddress = \"10.1.2.3:7400\"\n";

    #[test]
    fn a_network_address_without_a_key_is_refused_and_loopback_is_not() {
        let err = Topology::parse(NETWORKED).unwrap_err();
        assert!(matches!(err, TopologyError::KeyRequired { node: NodeId(0), .. }), "{err}");
        assert!(err.to_string().contains("tierstack cluster key"), "{err}");
        assert!(Topology::parse(&NETWORKED.replace("10.1.2.3", "127.0.0.1")).is_ok());
        let keyed = NETWORKED.replace("fabric = \"tcp\"", "fabric = \"tcp\"\nkey_file = \"k\"");
        assert!(Topology::parse(&keyed).is_ok());
        let tls = keyed.replace("key_file", "tls = true\nkey_file");
        assert!(Topology::parse(&tls).is_ok());
        let tls_without_key =
            NETWORKED.replace("10.1.2.3", "127.0.0.1").replace("fabric = \"tcp\"", "fabric = \"tcp\"\ntls = true");
        assert!(matches!(Topology::parse(&tls_without_key), Err(TopologyError::TlsNeedsTcpAndKey)));
        // shm never leaves the host: no key needed.
        assert!(Topology::parse(&NETWORKED.replace("\"tcp\"", "\"shm\"")).is_ok());
    }

    #[test]
    fn a_relative_key_file_is_found_beside_the_topology_and_checked() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let text = NETWORKED
            .replace("10.1.2.3", "127.0.0.1")
            .replace("fabric = \"tcp\"", "fabric = \"tcp\"\nkey_file = \"c.key\"");
        let path = dir.path().join("t.toml");
        std::fs::write(&path, text).unwrap();
        let topology = Topology::load(&path).unwrap();
        assert_eq!(topology.cluster.key_file.as_deref(), Some(dir.path().join("c.key").as_path()));
        assert!(matches!(topology.key(), Err(SecretError::Io { .. })), "a missing key file must fail");
        let key = ClusterKey::generate();
        key.write_new(&dir.path().join("c.key")).unwrap();
        assert_eq!(topology.key().unwrap().unwrap().fingerprint(), key.fingerprint());
        std::fs::set_permissions(dir.path().join("c.key"), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(topology.key(), Err(SecretError::Permissions { .. })));
        assert!(matches!(open_fabric(&topology, NodeId(0)), Err(OpenError::Key(SecretError::Permissions { .. }))));
    }
}
