//! The `shm` fabric backend: the truthful stand-in for RDMA on one host.
//!
//! Every node keeps its regions as files in its own directory under a shared
//! root (by default per user, `/dev/shm/tierstack-<uid>/<cluster>`:
//! [`default_root`]):
//!
//! ```text
//! <root>/node-<id>/owner.pid     the owning process id (liveness check)
//! <root>/node-<id>/r.<name>      one file per registered region: a header
//!                                (magic, revoked word, data offset, the
//!                                region's access rights), then the data
//! <root>/node-<id>/msg.ctl       the message control file: revoked word,
//!                                ring generation, per channel a doorbell
//! <root>/node-<id>/q.<c>.<from>.<incarnation>
//!                                a message ring from node <from> on channel
//!                                <c>, created by that sender
//! ```
//!
//! **The root is private to one user** (`private`): every directory the
//! backend creates is 0700 and every file 0600 (set explicitly, whatever
//! the umask), files are created `O_EXCL | O_NOFOLLOW` and opened
//! `O_NOFOLLOW`, and the root, each node directory and each file is checked
//! on open (`lstat`/`fstat`): a symbolic link, another user's entry, an
//! entry open to group or others or a file with a second hard link is
//! refused with [`FabricError::UnsafePath`], which says how to fix it (a
//! root of ours others may only read is made 0700). The root's ancestors
//! must be this user's or root's and writable by others only with the
//! sticky bit, so no one else can swap the root. Within the root only this
//! user can create anything, which is what makes a ring's sender id, a pid
//! file or a region file trustworthy: the receiver of a ring checks that
//! its file is a private file of its own user, so another user cannot
//! plant a ring (or pid file, or region) and speak as a node.
//!
//! **Access rights** ([`Access`]) are published by the owner in the region
//! file's header, before the file gets its name: the default rights and up
//! to [`GRANTS_MAX`] per-node grants. A peer reads them at `connect`; if
//! its rights include neither write nor atomic it opens the file `O_RDONLY`
//! and maps it `PROT_READ`, so even a bug cannot store to the region, and
//! every operation it posts is first checked against its rights (one test
//! of a cached byte on the single-operation paths, `Access::check` for a
//! batch) and refused with `Forbidden`. A node connecting to its own region
//! has every right, as its owner.
//!
//! The limit, stated rather than hidden: all of this is one host's trust in
//! one user. A process of the same user can open any of these files
//! read-write, write a ring that names any sender, or rewrite a header's
//! rights, whatever the checks; the kernel cannot tell it from a node. The
//! rights and the read-only mappings stop bugs and confused peers (a proxy
//! that would write a version table), not a hostile process running as the
//! cluster's user; other users are kept out entirely. Across hosts, or
//! against the same user, use the authenticated `tcp` or `ucx` fabric.
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
mod private;
pub mod ring;
mod sys;

pub use private::default_root;

use messages::{revoke_control_file, RingReceiver, RingSenders};
use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tierstack_base::limits::{NODES_MAX, REGIONS_PER_NODE_MAX};
use tierstack_base::NodeId;
use tierstack_fabric::{
    check_batch, execute_on_memory, validate_region_bytes, validate_region_name, Access, Channel, Completion, Fabric,
    FabricError, Inbox, Inboxes, LocalRegion, LocalSlice, Op, PeerState, RegionMemory, RemoteRegion, Result, Rights,
    TrySend,
};

/// How a node attaches to the `shm` fabric.
#[derive(Clone, Debug)]
pub struct ShmConfig {
    /// Directory shared by every node of the cluster (normally
    /// [`default_root`]). Created 0700 if missing; refused with
    /// `UnsafePath` if it is a symbolic link, another user's, or writable
    /// by others (one others may only read is made 0700).
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
    /// The canonical root (checked private when the node opened).
    root: PathBuf,
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

impl ShmFabric {
    /// Attaches `config.node` to the fabric under `config.root`, which is
    /// created (mode 0700) if missing and refused if not private to this
    /// user ([`FabricError::UnsafePath`]).
    pub fn open(config: ShmConfig) -> Result<Arc<ShmFabric>> {
        if let Some(nodes) = &config.nodes {
            if !nodes.contains(&config.node) {
                return Err(FabricError::UnknownNode { node: config.node });
            }
        }
        let root = private::prepare_root(&config.root)?;
        let dir = node_dir(&root, config.node);
        if private::check_private_dir(&dir)? {
            match private::read_owner_pid(&dir)? {
                Some(pid) if sys::process_alive(pid) => return Err(FabricError::NodeInUse { node: config.node, pid }),
                _ => {
                    tracing::info!(node = %config.node, "reclaiming the directory of a dead node");
                    revoke_directory(&dir);
                    fs::remove_dir_all(&dir)?;
                }
            }
        }
        private::create_private_dir(&dir)?;
        private::write_owner_pid(&dir)?;
        let receiver = Arc::new(RingReceiver::create(&dir, config.node, config.nodes.clone(), config.receive_spin)?);
        let inboxes = Arc::new(Inboxes::with_source(config.node, receiver.clone()));
        let senders = RingSenders::new(config.node, config.send_timeout);
        Ok(Arc::new(ShmFabric {
            config,
            root,
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
        Ok(node_dir(&self.root, node))
    }

    /// Fails with `PeerDead` unless `node` runs now, and with `UnsafePath`
    /// if its directory or pid file is not private to this user.
    fn check_alive(&self, node: NodeId, dir: &Path) -> Result<()> {
        let not_running = || FabricError::PeerDead { node, reason: "not running (no node directory)".into() };
        if !private::check_private_dir(dir)? {
            return Err(not_running());
        }
        match private::read_owner_pid(dir)? {
            None => Err(not_running()),
            Some(pid) if !sys::process_alive(pid) => {
                Err(FabricError::PeerDead { node, reason: format!("its process {pid} has exited") })
            }
            Some(_) => Ok(()),
        }
    }
}

/// The region file's header: fixed words, then the access table, then the
/// data (at a multiple of 64 bytes).
///
/// ```text
/// word 0   magic
/// word 1   revoked (nonzero once the owner closed or was reclaimed)
/// word 2   data offset in bytes
/// word 3   bits 0-7: the rights of peers not named; bits 32-63: grants
/// 64 ...   one word per grant: bits 0-31 node id, bits 32-39 its rights
/// ```
///
/// The owner writes it before the file gets its name and never changes it
/// (but the revoked word), so a peer reads its rights once, at connect.
const FIXED_HEADER_BYTES: u64 = 64;
const FILE_MAGIC: u64 = u64::from_le_bytes(*b"TSSHMRG2");
const REVOKED_OFFSET: usize = 8;
const DATA_OFFSET_OFFSET: usize = 16;
const RIGHTS_OFFSET: usize = 24;
/// The most nodes a region may name with rights of their own.
pub const GRANTS_MAX: usize = NODES_MAX as usize;

/// Where the data starts in a region file with `grants` grants.
fn data_offset(grants: usize) -> u64 {
    (FIXED_HEADER_BYTES + grants as u64 * 8).next_multiple_of(64)
}

/// The header words after the magic and revoked words that encode `access`.
fn encode_access(access: &Access) -> (u64, Vec<u64>) {
    let grants = access.grants();
    let rights = u64::from(access.default_rights().bits()) | (grants.len() as u64) << 32;
    let words = grants.iter().map(|(node, r)| u64::from(node.0) | u64::from(r.bits()) << 32).collect();
    (rights, words)
}

/// The access a region file's header states (the caller bounds the grants).
fn decode_access(rights_word: u64, grant_words: &[u64]) -> Access {
    let mut access = Access::new(Rights::from_bits(rights_word as u8));
    for word in grant_words {
        access = access.grant(NodeId(*word as u32), Rights::from_bits((word >> 32) as u8));
    }
    access
}

/// A mapped region file: its header words and its data.
struct RegionFile {
    map: Arc<memmap2::MmapRaw>,
    data_offset: usize,
}

impl RegionFile {
    /// Maps all of `file` (`len` bytes, data from `data_offset`), writable
    /// or read-only.
    fn map(file: &fs::File, len: u64, data_offset: u64, writable: bool) -> Result<RegionFile> {
        let bad = || FabricError::RegionSize { bytes: len, max: len };
        let total = usize::try_from(len).map_err(|_| bad())?;
        let data_offset = usize::try_from(data_offset).map_err(|_| bad())?;
        let options = memmap2::MmapOptions::new().len(total).clone();
        let map = if writable { options.map_raw(file)? } else { options.map_raw_read_only(file)? };
        Ok(RegionFile { map: Arc::new(map), data_offset })
    }

    fn header_word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: the mapping is page aligned and at least FIXED_HEADER_BYTES
        // long, offsets are 8-aligned within the header, and the header is
        // only accessed atomically by every process (stores only through a
        // writable mapping: the owner's and reclaiming node's).
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
        let data_len = (self.map.len() - self.data_offset) as u64;
        // SAFETY: data_offset is within the mapping (checked by the callers).
        let data = unsafe { self.map.as_mut_ptr().add(self.data_offset) };
        let base = NonNull::new(data).ok_or(FabricError::Closed)?;
        // SAFETY: `base` points to `data_len` bytes of the mapping, 64-byte
        // aligned, readable; writable unless this is a peer's read-only
        // mapping, through which nothing writes: `ShmRemote` refuses every
        // op that writes before it reaches the memory unless its rights
        // include it (and a bug past that check would fault, not corrupt).
        // The Arc moved in as the owner keeps the mapping alive. Every
        // process accesses it only through atomics.
        unsafe { RegionMemory::from_raw(name, base, data_len, Box::new(self.map.clone())) }
    }
}

/// Marks every region, and the message endpoint, of a dead owner's
/// directory revoked. Only private files of ours are touched.
fn revoke_directory(dir: &Path) {
    revoke_control_file(&dir.join(messages::layout::CONTROL_FILE));
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with("r.") {
            continue;
        }
        let Ok(Some(file)) = private::open_private_file(&entry.path(), true) else { continue };
        let Ok(len) = file.metadata().map(|m| m.len()) else { continue };
        if len <= FIXED_HEADER_BYTES {
            continue;
        }
        if let Ok(region) = RegionFile::map(&file, len, FIXED_HEADER_BYTES, true) {
            if region.magic().load(Ordering::Acquire) == FILE_MAGIC {
                region.revoke();
            }
        }
    }
}

/// Reads a peer's region header from `file` (`len` bytes): the data offset
/// and the access the owner published.
fn read_header(file: &fs::File, len: u64, node: NodeId, name: &str) -> Result<(u64, Access)> {
    let bad = |what: &str| FabricError::Protocol { node, reason: format!("region file {name:?} {what}") };
    if len <= FIXED_HEADER_BYTES {
        return Err(bad(&format!("has bad length {len}")));
    }
    let mut fixed = [0u8; FIXED_HEADER_BYTES as usize];
    file.read_exact_at(&mut fixed, 0)?;
    let word = |offset: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&fixed[offset..offset + 8]);
        u64::from_ne_bytes(bytes)
    };
    if word(0) != FILE_MAGIC {
        return Err(bad("has no valid header"));
    }
    if word(REVOKED_OFFSET) != 0 {
        return Err(FabricError::PeerDead { node, reason: format!("region {name:?} was revoked") });
    }
    let rights_word = word(RIGHTS_OFFSET);
    let grants = usize::try_from(rights_word >> 32).unwrap_or(usize::MAX);
    if grants > GRANTS_MAX {
        return Err(bad(&format!("names {grants} grants, more than {GRANTS_MAX}")));
    }
    let offset = word(DATA_OFFSET_OFFSET);
    if offset != data_offset(grants) || offset >= len || !(len - offset).is_multiple_of(8) {
        return Err(bad(&format!("has data offset {offset} in a file of {len} bytes with {grants} grants")));
    }
    let mut table = vec![0u8; grants * 8];
    file.read_exact_at(&mut table, FIXED_HEADER_BYTES)?;
    let grant_words: Vec<u64> =
        table.chunks_exact(8).map(|b| u64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])).collect();
    Ok((offset, decode_access(rights_word, &grant_words)))
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
        let grants = access.grants().len();
        if grants > GRANTS_MAX {
            return Err(FabricError::Io(format!(
                "region {name:?} grants rights to {grants} nodes; the shm backend keeps at most {GRANTS_MAX}"
            )));
        }
        // Create under a temporary name (new, private, never through a
        // link) and rename, so a peer never maps a file whose size or
        // header is not yet set.
        let staging = self.node_dir.join(format!(".staging.{name}"));
        let file = private::create_private_file(&staging)?;
        let offset = data_offset(grants);
        file.set_len(offset + len)?;
        let region_file = RegionFile::map(&file, offset + len, offset, true)?;
        let (rights_word, grant_words) = encode_access(&access);
        region_file.header_word(DATA_OFFSET_OFFSET).store(offset, Ordering::Relaxed);
        region_file.header_word(RIGHTS_OFFSET).store(rights_word, Ordering::Relaxed);
        for (i, word) in grant_words.iter().enumerate() {
            region_file.header_word(FIXED_HEADER_BYTES as usize + 8 * i).store(*word, Ordering::Relaxed);
        }
        region_file.magic().store(FILE_MAGIC, Ordering::Release);
        let region = Arc::new(LocalRegion::with_access(name, region_file.memory(name)?, access));
        fs::rename(&staging, region_path(&self.node_dir, name))?;
        regions.insert(name.to_string(), (region.clone(), region_file));
        Ok(region)
    }

    /// Maps the region writable only if the owner's published access lets
    /// this node write or use atomics; read-only (opened `O_RDONLY`, mapped
    /// `PROT_READ`) otherwise. A node connecting to its own region has
    /// every right, as its owner.
    fn connect(&self, node: NodeId, name: &str) -> Result<Arc<dyn RemoteRegion>> {
        validate_region_name(name)?;
        let dir = self.peer_dir(node)?;
        self.check_alive(node, &dir)?;
        let path = region_path(&dir, name);
        let unknown = || FabricError::UnknownRegion { node, name: name.to_string() };
        let file = private::open_private_file(&path, false)?.ok_or_else(unknown)?;
        let meta = file.metadata()?;
        let (offset, access) = read_header(&file, meta.len(), node, name)?;
        let me = self.config.node;
        let rights = if node == me { Rights::ALL } else { access.rights_of(me) };
        let file = if rights.modifies() {
            let writable = private::open_private_file(&path, true)?.ok_or_else(unknown)?;
            let again = writable.metadata()?;
            if (again.dev(), again.ino()) != (meta.dev(), meta.ino()) {
                return Err(FabricError::Protocol {
                    node,
                    reason: format!("region file {name:?} was replaced while connecting"),
                });
            }
            writable
        } else {
            file
        };
        let region_file = RegionFile::map(&file, meta.len(), offset, rights.modifies())?;
        if region_file.magic().load(Ordering::Acquire) != FILE_MAGIC {
            return Err(FabricError::Protocol { node, reason: format!("region file {name:?} has no valid header") });
        }
        let memory = region_file.memory(name)?;
        Ok(Arc::new(ShmRemote { node, me, name: name.to_string(), memory, file: region_file, access, rights }))
    }

    fn send(&self, to: NodeId, channel: Channel, payload: &[u8]) -> Result<()> {
        if let Some(nodes) = &self.config.nodes {
            if !nodes.contains(&to) {
                return Err(FabricError::UnknownNode { node: to });
            }
        }
        self.senders.send(to, &|| node_dir(&self.root, to), channel, payload)
    }

    fn try_send(&self, to: NodeId, channel: Channel, payload: &[u8]) -> Result<TrySend> {
        if let Some(nodes) = &self.config.nodes {
            if !nodes.contains(&to) {
                return Err(FabricError::UnknownNode { node: to });
            }
        }
        self.senders.try_send(to, &|| node_dir(&self.root, to), channel, payload)
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
        let Ok(dir) = self.peer_dir(node) else { return PeerState::Unknown };
        match self.check_alive(node, &dir) {
            Ok(()) => PeerState::Running,
            // A planted directory or pid file says nothing about the node.
            Err(FabricError::UnsafePath { .. }) => PeerState::Unknown,
            Err(_) => PeerState::Gone,
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
    /// This node: whose rights apply.
    me: NodeId,
    name: String,
    memory: RegionMemory,
    file: RegionFile,
    /// What the owner published, and this node's share of it.
    access: Access,
    rights: Rights,
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

    /// Fails with `Forbidden` unless this node may do `needed`: the single
    /// operations' form of `Access::check` (one test of a cached byte).
    #[inline]
    fn check_right(&self, needed: Rights) -> Result<()> {
        if self.rights.contains(needed) {
            Ok(())
        } else {
            Err(FabricError::Forbidden { node: self.me, region: self.name.clone(), needed, granted: self.rights })
        }
    }

    /// Both checks every operation makes first.
    #[inline]
    fn check(&self, needed: Rights) -> Result<()> {
        self.check_live()?;
        self.check_right(needed)
    }

    /// The batch form: every op of `ops` must be allowed.
    fn check_ops(&self, ops: &[Op]) -> Result<()> {
        if self.me == self.node {
            return Ok(());
        }
        self.access.check(&self.name, self.me, ops)
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
                .and_then(|()| self.check_ops(&ops))
                .and_then(|()| check_batch(&self.name, self.memory.len(), &ops))
                .and_then(|()| execute_on_memory(&self.memory, &ops)),
        )
    }

    // The single-operation forms skip the batch's allocations: this is the
    // hot path of version checks and lock words.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(Rights::READ)?;
        self.memory.read(offset, buf)
    }

    fn read_u64(&self, offset: u64) -> Result<u64> {
        self.check(Rights::READ)?;
        self.memory.load_u64(offset)
    }

    fn read_words_now(&self, offsets: &[u64], words: &mut [u64]) -> Option<Result<()>> {
        Some(self.check(Rights::READ).and_then(|()| {
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
        self.check(Rights::WRITE)?;
        self.memory.write(offset, data)
    }

    fn write_from(&self, offset: u64, source: &LocalSlice) -> Result<()> {
        self.check(Rights::WRITE)?;
        check_batch(&self.name, self.memory.len(), &[Op::WriteFrom { offset, source: source.clone() }])?;
        self.memory.copy_from(offset, source.region().memory(), source.offset(), u64::from(source.len()))
    }

    fn read_into(&self, offset: u64, target: &LocalSlice) -> Result<()> {
        self.check(Rights::READ)?;
        check_batch(&self.name, self.memory.len(), &[Op::ReadInto { offset, target: target.clone() }])?;
        target.region().memory().copy_from(target.offset(), &self.memory, offset, u64::from(target.len()))
    }

    fn fetch_add(&self, offset: u64, delta: u64) -> Result<u64> {
        self.check(Rights::ATOMIC)?;
        self.memory.fetch_add(offset, delta)
    }

    fn compare_swap(&self, offset: u64, expected: u64, new: u64) -> Result<u64> {
        self.check(Rights::ATOMIC)?;
        self.memory.compare_swap(offset, expected, new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_access_survives_its_header_encoding() {
        for access in [
            Access::all(),
            Access::read_only(),
            Access::new(Rights::NONE),
            Access::read_only().grant(NodeId(1), Rights::ALL),
            Access::new(Rights::ATOMIC).grant(NodeId(u32::MAX), Rights::READ).grant(NodeId(0), Rights::NONE),
        ] {
            let (rights, grants) = encode_access(&access);
            let decoded = decode_access(rights, &grants);
            assert_eq!(decoded.default_rights(), access.default_rights());
            assert_eq!(decoded.grants(), access.grants());
            assert_eq!(data_offset(grants.len()) % 64, 0);
            assert!(data_offset(grants.len()) >= FIXED_HEADER_BYTES + 8 * grants.len() as u64);
        }
    }
}
