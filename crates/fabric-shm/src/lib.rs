//! The `shm` fabric backend: the truthful stand-in for RDMA on one host.
//!
//! Every node keeps its regions as files in its own directory under a shared
//! root (normally on `/dev/shm`):
//!
//! ```text
//! <root>/node-<id>/owner.pid     the owning process id (liveness check)
//! <root>/node-<id>/r.<name>      one file per registered region: a 64-byte
//!                                header (magic, revoked word), then the data
//! <root>/node-<id>/msg.ctl       the message control file: revoked word,
//!                                ring generation, per channel a doorbell
//! <root>/node-<id>/q.<c>.<from>.<incarnation>
//!                                a message ring from node <from> on channel
//!                                <c>, created by that sender
//! ```
//!
//! A peer that connects to a region maps its file into its own address space,
//! and from then on `read`, `write`, `fetch_add` and `compare_swap` are plain
//! loads, stores and atomics on that mapping, executed by the caller's thread.
//! **The owner's threads never run for a one-sided operation**: the tests
//! stop the owner with SIGSTOP and keep operating on its regions. A
//! `WriteFrom` or `ReadInto` is one copy, from one mapping to the other (the
//! caller's registered region and the peer's), word by word with atomics.
//!
//! Two-sided messages are genuinely two-sided here as in RDMA send/receive:
//! the sender writes a message into a ring in the receiver's memory and the
//! receiver's thread takes it out; neither side runs code for the other.
//! There is one single-producer single-consumer ring per sender, receiver
//! and channel ([`messages`](crate::messages)), so a full channel holds back
//! that channel only. A receiving thread polls its rings for a while (an
//! adaptive spin up to [`ShmConfig::receive_spin`]) and then sleeps on a
//! futex that senders ring only when someone sleeps: no receiver thread, no
//! system call on the busy path, no CPU when idle. Messages larger than a
//! ring fragment are split and streamed. The word protocols ([`ring`]: the
//! ring's head/tail and the doorbell) are model-checked with loom.
//!
//! Liveness: `connect` reads `owner.pid` and refuses a dead owner with
//! `PeerDead`; `send` does too, and a send to a receiver that closed (its
//! control file's revoked word) or crashed (its pid, checked every few ms
//! of sending and of waiting for room) fails with `PeerDead`, never hangs.
//! A node directory left by a dead process is reclaimed when the node id
//! is opened again.
//!
//! Revocation: a mapping outlives its owner, so a peer could keep reading a
//! dead owner's frozen memory. As RDMA invalidates a dead owner's keys, every
//! region file starts with a `revoked` word, set when the owner closes its
//! node and when a crashed owner's node id is reclaimed; every operation on a
//! peer's handle checks it (one load) and fails with `PeerDead` once it is set.

pub mod messages;
pub mod ring;
mod sys;

use messages::{revoke_control_file, RingReceiver, RingSenders};
use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tierstack_base::limits::REGIONS_PER_NODE_MAX;
use tierstack_base::NodeId;
use tierstack_fabric::{
    check_batch, execute_on_memory, validate_region_bytes, validate_region_name, Access, Channel, Completion, Fabric,
    FabricError, Inbox, Inboxes, LocalRegion, LocalSlice, Op, PeerState, RegionMemory, RemoteRegion, Result,
};

/// How a node attaches to the `shm` fabric.
#[derive(Clone, Debug)]
pub struct ShmConfig {
    /// Directory shared by every node of the cluster (e.g. `/dev/shm/tierstack-demo`).
    pub root: PathBuf,
    /// This node.
    pub node: NodeId,
    /// The cluster's nodes; when set, other ids are refused with `UnknownNode`.
    pub nodes: Option<Vec<NodeId>>,
    /// Bound on blocking message sends to a receiver that does not drain.
    pub send_timeout: Duration,
    /// The longest a thread waiting on an inbox polls the rings before it
    /// sleeps (zero: sleep at once). Polling sees a message within
    /// nanoseconds and costs a CPU meanwhile; a sleeping receiver is woken
    /// by the sender's futex wake, some microseconds later. Each channel
    /// adapts its spin below this most (`messages::next_spin`): polling that
    /// catches messages goes on, polling that does not fades to nothing.
    pub receive_spin: Duration,
}

/// The default [`ShmConfig::receive_spin`]: longer than a message round
/// trip between polling nodes, so a conversation stays on the fast path,
/// short enough (and adaptive) that an idle receiver's polling costs
/// nothing measurable.
pub const RECEIVE_SPIN_DEFAULT: Duration = Duration::from_micros(50);

impl ShmConfig {
    pub fn new(root: impl Into<PathBuf>, node: NodeId) -> Self {
        Self {
            root: root.into(),
            node,
            nodes: None,
            send_timeout: Duration::from_millis(1000),
            receive_spin: RECEIVE_SPIN_DEFAULT,
        }
    }

    pub fn with_nodes(mut self, nodes: Vec<NodeId>) -> Self {
        self.nodes = Some(nodes);
        self
    }

    pub fn with_send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = timeout;
        self
    }

    pub fn with_receive_spin(mut self, spin: Duration) -> Self {
        self.receive_spin = spin;
        self
    }
}

/// A node attached to the `shm` fabric.
pub struct ShmFabric {
    config: ShmConfig,
    node_dir: PathBuf,
    regions: Mutex<HashMap<String, (Arc<LocalRegion>, RegionFile)>>,
    inboxes: Arc<Inboxes>,
    receiver: Arc<RingReceiver>,
    senders: RingSenders,
}

fn node_dir(root: &Path, node: NodeId) -> PathBuf {
    root.join(format!("node-{}", node.0))
}

fn region_path(node_dir: &Path, name: &str) -> PathBuf {
    node_dir.join(format!("r.{name}"))
}

fn read_owner_pid(node_dir: &Path) -> Option<u32> {
    fs::read_to_string(node_dir.join("owner.pid")).ok()?.trim().parse().ok()
}

impl ShmFabric {
    /// Attaches `config.node` to the fabric under `config.root`.
    pub fn open(config: ShmConfig) -> Result<Arc<ShmFabric>> {
        if let Some(nodes) = &config.nodes {
            if !nodes.contains(&config.node) {
                return Err(FabricError::UnknownNode { node: config.node });
            }
        }
        fs::create_dir_all(&config.root)?;
        let dir = node_dir(&config.root, config.node);
        if dir.exists() {
            match read_owner_pid(&dir) {
                Some(pid) if sys::process_alive(pid) => return Err(FabricError::NodeInUse { node: config.node, pid }),
                _ => {
                    tracing::info!(node = %config.node, "reclaiming the directory of a dead node");
                    revoke_directory(&dir);
                    fs::remove_dir_all(&dir)?;
                }
            }
        }
        fs::create_dir(&dir)?;
        fs::write(dir.join("owner.pid"), std::process::id().to_string())?;
        let receiver = Arc::new(RingReceiver::create(&dir, config.node, config.nodes.clone(), config.receive_spin)?);
        let inboxes = Arc::new(Inboxes::with_source(config.node, receiver.clone()));
        let senders = RingSenders::new(config.node, config.send_timeout);
        Ok(Arc::new(ShmFabric {
            config,
            node_dir: dir,
            regions: Mutex::new(HashMap::new()),
            inboxes,
            receiver,
            senders,
        }))
    }

    /// The node directory of `node`, after the cluster-membership check.
    fn peer_dir(&self, node: NodeId) -> Result<PathBuf> {
        if let Some(nodes) = &self.config.nodes {
            if !nodes.contains(&node) {
                return Err(FabricError::UnknownNode { node });
            }
        }
        Ok(node_dir(&self.config.root, node))
    }

    /// Fails with `PeerDead` unless `node` runs now.
    fn check_alive(&self, node: NodeId, dir: &Path) -> Result<()> {
        match read_owner_pid(dir) {
            None => Err(FabricError::PeerDead { node, reason: "not running (no node directory)".into() }),
            Some(pid) if !sys::process_alive(pid) => {
                Err(FabricError::PeerDead { node, reason: format!("its process {pid} has exited") })
            }
            Some(_) => Ok(()),
        }
    }
}

/// Bytes in front of a region's data: magic, revoked word, reserved.
const FILE_HEADER_BYTES: u64 = 64;
const FILE_MAGIC: u64 = u64::from_le_bytes(*b"TSSHMRG1");
const REVOKED_OFFSET: usize = 8;

/// A mapped region file: its header words and its data.
struct RegionFile {
    map: Arc<memmap2::MmapRaw>,
}

impl RegionFile {
    /// Maps `file`, whose data part is `data_len` bytes.
    fn map(file: &fs::File, data_len: u64) -> Result<RegionFile> {
        let total = usize::try_from(FILE_HEADER_BYTES + data_len)
            .map_err(|_| FabricError::RegionSize { bytes: data_len, max: data_len })?;
        let map = memmap2::MmapOptions::new().len(total).map_raw(file)?;
        Ok(RegionFile { map: Arc::new(map) })
    }

    fn header_word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: the mapping is page aligned and at least FILE_HEADER_BYTES
        // long, offsets are 8-aligned within the header, and the header is
        // only accessed atomically by every process.
        unsafe { &*self.map.as_mut_ptr().add(offset).cast::<AtomicU64>() }
    }

    fn magic(&self) -> &AtomicU64 {
        self.header_word(0)
    }

    fn revoked(&self) -> &AtomicU64 {
        self.header_word(REVOKED_OFFSET)
    }

    fn revoke(&self) {
        self.revoked().store(1, Ordering::Release);
    }

    fn memory(&self, name: &str) -> Result<RegionMemory> {
        let data_len = self.map.len() as u64 - FILE_HEADER_BYTES;
        // SAFETY: FILE_HEADER_BYTES is within the mapping.
        let data = unsafe { self.map.as_mut_ptr().add(FILE_HEADER_BYTES as usize) };
        let base = NonNull::new(data).ok_or(FabricError::Closed)?;
        // SAFETY: `base` points to `data_len` bytes of the mapping, 64-byte
        // aligned, readable and writable; the Arc moved in as the owner keeps
        // the mapping alive. Every process accesses it only through atomics.
        unsafe { RegionMemory::from_raw(name, base, data_len, Box::new(self.map.clone())) }
    }
}

/// Marks every region, and the message endpoint, of a dead owner's
/// directory revoked.
fn revoke_directory(dir: &Path) {
    revoke_control_file(&dir.join(messages::layout::CONTROL_FILE));
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with("r.") {
            continue;
        }
        let Ok(file) = OpenOptions::new().read(true).write(true).open(entry.path()) else { continue };
        let Ok(len) = file.metadata().map(|m| m.len()) else { continue };
        if len <= FILE_HEADER_BYTES {
            continue;
        }
        if let Ok(region) = RegionFile::map(&file, len - FILE_HEADER_BYTES) {
            if region.magic().load(Ordering::Acquire) == FILE_MAGIC {
                region.revoke();
            }
        }
    }
}

impl Fabric for ShmFabric {
    fn local_node(&self) -> NodeId {
        self.config.node
    }

    fn backend_name(&self) -> &'static str {
        "shm"
    }

    fn register(&self, name: &str, bytes: u64, access: Access) -> Result<Arc<LocalRegion>> {
        validate_region_name(name)?;
        let len = validate_region_bytes(bytes)?;
        let mut regions = self.regions.lock().map_err(|_| FabricError::Closed)?;
        if regions.contains_key(name) {
            return Err(FabricError::RegionExists { name: name.to_string() });
        }
        if regions.len() >= REGIONS_PER_NODE_MAX {
            return Err(FabricError::TooManyRegions { max: REGIONS_PER_NODE_MAX });
        }
        // Create under a temporary name and rename, so a peer never maps a
        // file whose size is not yet set.
        let staging = self.node_dir.join(format!(".staging.{name}"));
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&staging)?;
        file.set_len(FILE_HEADER_BYTES + len)?;
        let region_file = RegionFile::map(&file, len)?;
        region_file.magic().store(FILE_MAGIC, Ordering::Release);
        let region = Arc::new(LocalRegion::with_access(name, region_file.memory(name)?, access));
        fs::rename(&staging, region_path(&self.node_dir, name))?;
        regions.insert(name.to_string(), (region.clone(), region_file));
        Ok(region)
    }

    fn connect(&self, node: NodeId, name: &str) -> Result<Arc<dyn RemoteRegion>> {
        validate_region_name(name)?;
        let dir = self.peer_dir(node)?;
        self.check_alive(node, &dir)?;
        let file = match OpenOptions::new().read(true).write(true).open(region_path(&dir, name)) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(FabricError::UnknownRegion { node, name: name.to_string() })
            }
            Err(e) => return Err(e.into()),
        };
        let file_len = file.metadata()?.len();
        if file_len <= FILE_HEADER_BYTES || !file_len.is_multiple_of(8) {
            return Err(FabricError::Protocol {
                node,
                reason: format!("region file {name:?} has bad length {file_len}"),
            });
        }
        let region_file = RegionFile::map(&file, file_len - FILE_HEADER_BYTES)?;
        if region_file.magic().load(Ordering::Acquire) != FILE_MAGIC {
            return Err(FabricError::Protocol { node, reason: format!("region file {name:?} has no valid header") });
        }
        if region_file.revoked().load(Ordering::Acquire) != 0 {
            return Err(FabricError::PeerDead { node, reason: format!("region {name:?} was revoked") });
        }
        let memory = region_file.memory(name)?;
        Ok(Arc::new(ShmRemote { node, name: name.to_string(), memory, file: region_file }))
    }

    fn send(&self, to: NodeId, channel: Channel, payload: &[u8]) -> Result<()> {
        if let Some(nodes) = &self.config.nodes {
            if !nodes.contains(&to) {
                return Err(FabricError::UnknownNode { node: to });
            }
        }
        self.senders.send(to, &|| node_dir(&self.config.root, to), channel, payload)
    }

    fn inbox(&self, channel: Channel) -> &Inbox {
        self.inboxes.get(channel)
    }

    /// From the peer's pid file: definite, since a pid file names a process
    /// that either exists or not (a reused pid errs towards `Running`).
    fn peer_state(&self, node: NodeId) -> PeerState {
        if node == self.config.node {
            return PeerState::Running;
        }
        match self.peer_dir(node) {
            Ok(dir) if self.check_alive(node, &dir).is_ok() => PeerState::Running,
            Ok(_) => PeerState::Gone,
            Err(_) => PeerState::Unknown,
        }
    }
}

impl Drop for ShmFabric {
    fn drop(&mut self) {
        self.receiver.close();
        self.senders.close();
        if let Ok(regions) = self.regions.lock() {
            for (_, file) in regions.values() {
                file.revoke();
            }
        }
        // Peers' handles now fail with PeerDead (revoked); new connects see
        // the node as not running.
        if let Err(e) = fs::remove_dir_all(&self.node_dir) {
            tracing::warn!(dir = %self.node_dir.display(), error = %e, "could not remove node directory");
        }
    }
}

/// A mapped peer region. Every operation runs on the caller's thread.
struct ShmRemote {
    node: NodeId,
    name: String,
    memory: RegionMemory,
    file: RegionFile,
}

impl ShmRemote {
    /// Fails once the owner has revoked the region (exited).
    #[inline]
    fn check_live(&self) -> Result<()> {
        if self.file.revoked().load(Ordering::Acquire) == 0 {
            Ok(())
        } else {
            Err(FabricError::PeerDead { node: self.node, reason: format!("region {:?} was revoked", self.name) })
        }
    }
}

impl RemoteRegion for ShmRemote {
    fn node(&self) -> NodeId {
        self.node
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.memory.len()
    }

    fn post(&self, ops: Vec<Op>) -> Completion {
        Completion::ready(
            self.check_live()
                .and_then(|()| check_batch(&self.name, self.memory.len(), &ops))
                .and_then(|()| execute_on_memory(&self.memory, &ops)),
        )
    }

    // The single-operation forms skip the batch's allocations: this is the
    // hot path of version checks and lock words.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_live()?;
        self.memory.read(offset, buf)
    }

    fn read_u64(&self, offset: u64) -> Result<u64> {
        self.check_live()?;
        self.memory.load_u64(offset)
    }

    fn read_words_now(&self, offsets: &[u64], words: &mut [u64]) -> Option<Result<()>> {
        Some(self.check_live().and_then(|()| {
            if offsets.len() != words.len() {
                return Err(FabricError::BatchSize { ops: offsets.len(), max: words.len() });
            }
            for (word, &offset) in words.iter_mut().zip(offsets) {
                *word = self.memory.load_u64(offset)?;
            }
            Ok(())
        }))
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_live()?;
        self.memory.write(offset, data)
    }

    fn write_from(&self, offset: u64, source: &LocalSlice) -> Result<()> {
        self.check_live()?;
        check_batch(&self.name, self.memory.len(), &[Op::WriteFrom { offset, source: source.clone() }])?;
        self.memory.copy_from(offset, source.region().memory(), source.offset(), u64::from(source.len()))
    }

    fn read_into(&self, offset: u64, target: &LocalSlice) -> Result<()> {
        self.check_live()?;
        check_batch(&self.name, self.memory.len(), &[Op::ReadInto { offset, target: target.clone() }])?;
        target.region().memory().copy_from(target.offset(), &self.memory, offset, u64::from(target.len()))
    }

    fn fetch_add(&self, offset: u64, delta: u64) -> Result<u64> {
        self.check_live()?;
        self.memory.fetch_add(offset, delta)
    }

    fn compare_swap(&self, offset: u64, expected: u64, new: u64) -> Result<u64> {
        self.check_live()?;
        self.memory.compare_swap(offset, expected, new)
    }
}
