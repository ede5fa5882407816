//! The front end's side: the four schemes (seed-notes b.2), each a
//! [`LoadSource`] that reads the load of a list of back ends.
//!
//! | scheme | the value comes from | a back-end thread must run |
//! |---|---|---|
//! | [`Scheme::SocketAsync`] | the latest frame the monitor thread pushed | yes, every interval |
//! | [`Scheme::SocketSync`] | a TCP request answered by a monitor thread | yes, to answer |
//! | [`Scheme::RdmaAsync`] | a one-sided read of the sampled seqlock record | yes, the sampler |
//! | [`Scheme::RdmaSync`] | a one-sided read of the counters word | **no** |
//!
//! The names come from the paper the seed cites ([19], Vaidyanathan et al.);
//! the seed itself does not name them.
//!
//! A read never fails: it returns a [`Reading`] whose [`Health`] says how far
//! to trust it. A back end whose process is gone is [`Health::Dead`] (a read
//! fails with `PeerDead`, the fabric reports it `Gone`, or its socket server
//! refuses connections or does not accept them in time), never stale forever.
//! A back end whose process is there but does not run (stopped, or its
//! serving runtime wedged) is [`Health::Suspect`]: its progress word
//! ([`crate::publisher::HEARTBEAT`]) has stood still for longer than
//! [`SourceConfig::suspect_after`] (RDMA-Sync reads the word live, the async
//! schemes in the sampled record), or it did not answer a read in that
//! time. After such a read the node is not asked again for `suspect_after`:
//! a hung node costs a reader one bounded wait per window, not one per read.

use crate::agent::{decode_frame, FRAME_BYTES, REQUEST_SUBSCRIBE, REQUEST_SYNC};
use crate::publisher::{sampled_record, COUNTERS_OFFSET, MAGIC, MAGIC_OFFSET, PROGRESS_OFFSET, REGION_NAME};
use crate::record::{Counters, LoadRecord, RECORD_WORDS};
use crate::MonitorError;
use serde::Serialize;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use tierstack_base::{host_monotonic_ns, NodeId};
use tierstack_fabric::{Fabric, FabricError, Op, PeerState, RemoteRegion};

/// The four monitoring schemes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheme {
    SocketAsync,
    SocketSync,
    RdmaAsync,
    RdmaSync,
}

impl Scheme {
    pub const ALL: [Scheme; 4] = [Scheme::SocketAsync, Scheme::SocketSync, Scheme::RdmaAsync, Scheme::RdmaSync];

    pub fn name(self) -> &'static str {
        match self {
            Scheme::SocketAsync => "socket-async",
            Scheme::SocketSync => "socket-sync",
            Scheme::RdmaAsync => "rdma-async",
            Scheme::RdmaSync => "rdma-sync",
        }
    }

    /// Whether the scheme reads over the fabric (else over TCP sockets).
    pub fn is_rdma(self) -> bool {
        matches!(self, Scheme::RdmaAsync | Scheme::RdmaSync)
    }
}

impl std::fmt::Display for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Scheme {
    type Err = MonitorError;
    fn from_str(s: &str) -> Result<Self, MonitorError> {
        Scheme::ALL.into_iter().find(|scheme| scheme.name() == s).ok_or_else(|| {
            MonitorError::BadConfig(format!(
                "unknown monitoring scheme {s:?} (expected socket-async, socket-sync, rdma-async or rdma-sync)"
            ))
        })
    }
}

/// How far a reading can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Read now, or sampled within the scheme's staleness bound.
    Fresh,
    /// The last value known, older than the bound (or the read failed in a
    /// way that does not prove the node dead).
    Stale,
    /// The node answers (or its memory is readable) but shows no progress:
    /// its heartbeat has stood still, or it did not answer in time. Its
    /// process is stopped or wedged; the value is the last known.
    Suspect,
    /// The node's process is gone.
    Dead,
    /// Nothing has been read from it yet.
    Unknown,
}

/// One reading of one back end's load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Reading {
    /// The value (its `t_ns` is when it was sampled).
    pub record: LoadRecord,
    /// When the front end got it (`CLOCK_MONOTONIC`, ns).
    pub read_ns: u64,
    pub health: Health,
}

impl Reading {
    /// How old the value was when it was read.
    pub fn age_ns(&self) -> u64 {
        self.read_ns.saturating_sub(self.record.t_ns)
    }

    fn unknown(read_ns: u64) -> Self {
        Reading { record: LoadRecord::default(), read_ns, health: Health::Unknown }
    }
}

/// Bounds every scheme applies.
#[derive(Clone, Copy, Debug)]
pub struct SourceConfig {
    /// A value older than this is [`Health::Stale`] (async schemes).
    pub stale_after: Duration,
    /// RDMA-Sync: how often to ask the fabric whether the node still runs
    /// (a one-sided read of a killed node's memory still succeeds on shm).
    pub liveness_every: Duration,
    /// Socket schemes: connect timeout, and answer timeout without
    /// `suspect_after`.
    pub socket_timeout: Duration,
    /// A node whose progress word stands still this long, or that does not
    /// answer a read in this time, is [`Health::Suspect`]; `None` turns
    /// the liveness check off (the node is then trusted while it answers).
    pub suspect_after: Option<Duration>,
}

/// Default of [`SourceConfig::suspect_after`]: 20 heartbeats. A serving
/// runtime that cannot run one 10 ms timer task in 200 ms is as good as hung
/// for a balancer; a loaded one still beats well within it.
pub const SUSPECT_AFTER_DEFAULT: Duration = Duration::from_millis(200);

impl SourceConfig {
    /// Defaults for an async interval: stale after three intervals (at
    /// least 50 ms), liveness every 100 ms, sockets time out after 1 s,
    /// suspect after [`SUSPECT_AFTER_DEFAULT`] without progress.
    pub fn for_interval(interval: Duration) -> Self {
        SourceConfig {
            stale_after: (interval * 3).max(Duration::from_millis(50)),
            liveness_every: Duration::from_millis(100),
            socket_timeout: Duration::from_secs(1),
            suspect_after: Some(SUSPECT_AFTER_DEFAULT),
        }
    }

    fn suspect_after_ns(&self) -> Option<u64> {
        self.suspect_after.map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

/// Watches one node's progress word across readings (pure).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgressWatch {
    last: u64,
    /// When `last` was first seen (reader's clock); 0: nothing seen yet.
    seen_ns: u64,
    /// No read is to be tried before this (after a read that hung).
    quiet_until_ns: u64,
    /// Reads that hung in a row: each doubles the quiet window.
    hangs: u32,
}

/// Most doublings of the quiet window after reads that hang in a row: a
/// node hung for long is asked once per 32 bounds (6.4 s at the default),
/// so a read that blocks (all the node's readers wait behind it) takes a
/// small share of the time, and a resumed node is noticed within that.
pub const HUNG_DOUBLINGS_MAX: u32 = 5;

impl ProgressWatch {
    /// Takes the progress word `progress` read at `now_ns`; true if it has
    /// stood still for more than `bound_ns`. A word of 0 is a node that
    /// keeps no heartbeat: never suspect.
    pub fn stalled(&mut self, progress: u64, now_ns: u64, bound_ns: Option<u64>) -> bool {
        self.hangs = 0; // it answered
        if self.seen_ns == 0 || progress != self.last {
            self.last = progress;
            self.seen_ns = now_ns;
            return false;
        }
        progress != 0 && bound_ns.is_some_and(|bound| now_ns.saturating_sub(self.seen_ns) > bound)
    }

    /// A read hung (timed out): no read before `now_ns + bound_ns`,
    /// doubled for each read that hung since the node last answered (at
    /// most [`HUNG_DOUBLINGS_MAX`] times).
    pub fn hung(&mut self, now_ns: u64, bound_ns: u64) {
        let window = bound_ns.saturating_mul(1 << self.hangs.min(HUNG_DOUBLINGS_MAX));
        self.quiet_until_ns = now_ns.saturating_add(window);
        self.hangs = self.hangs.saturating_add(1);
    }

    /// Whether a read may be tried at `now_ns`.
    pub fn may_read(&self, now_ns: u64) -> bool {
        now_ns >= self.quiet_until_ns
    }
}

/// A front end's view of several back ends' load through one scheme.
pub trait LoadSource: Send + Sync {
    fn scheme(&self) -> Scheme;
    /// How many back ends it reads (indices `0..len`).
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Reads back end `index`'s load now (as the scheme can).
    fn read(&self, index: usize) -> Reading;
    /// Whether a read may wait on the network (Socket-Sync, a fabric other
    /// than shm): an async caller then reads on a blocking thread.
    fn reads_wait_on_the_network(&self) -> bool {
        false
    }
}

/// Where a back end is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendAddress {
    /// Its fabric node (RDMA schemes).
    pub node: Option<NodeId>,
    /// Its monitor socket server (socket schemes).
    pub socket: Option<SocketAddr>,
}

/// Builds the source of `scheme` over `backends`.
pub fn open_source(
    scheme: Scheme,
    fabric: Option<Arc<dyn Fabric>>,
    backends: &[BackendAddress],
    config: SourceConfig,
) -> Result<Arc<dyn LoadSource>, MonitorError> {
    if scheme.is_rdma() {
        let fabric = fabric.ok_or_else(|| MonitorError::BadConfig(format!("{scheme} needs a fabric node")))?;
        let nodes = backends
            .iter()
            .map(|b| b.node.ok_or_else(|| MonitorError::BadConfig(format!("{scheme} needs every back end's node id"))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(RdmaSource::new(scheme, fabric, nodes, config)))
    } else {
        let sockets = backends
            .iter()
            .map(|b| {
                b.socket
                    .ok_or_else(|| MonitorError::BadConfig(format!("{scheme} needs every back end's monitor socket")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(match scheme {
            Scheme::SocketSync => Arc::new(SocketSyncSource::new(sockets, config)),
            _ => Arc::new(SocketAsyncSource::start(sockets, config)?),
        })
    }
}

// ---------------------------------------------------------------- RDMA ----

struct RdmaNode {
    node: NodeId,
    region: Option<Arc<dyn RemoteRegion>>,
    last: Option<LoadRecord>,
    liveness_checked_ns: u64,
    watch: ProgressWatch,
    /// RDMA-Async: the live progress word, read only when the sampled
    /// record's stands still (a starved sampler is not a hung node).
    live: ProgressWatch,
}

/// RDMA-Sync and RDMA-Async: one-sided reads of `monitor.load`.
pub struct RdmaSource {
    scheme: Scheme,
    fabric: Arc<dyn Fabric>,
    nodes: Vec<Mutex<RdmaNode>>,
    config: SourceConfig,
}

impl RdmaSource {
    pub fn new(scheme: Scheme, fabric: Arc<dyn Fabric>, nodes: Vec<NodeId>, config: SourceConfig) -> Self {
        let nodes = nodes
            .into_iter()
            .map(|node| {
                Mutex::new(RdmaNode {
                    node,
                    region: None,
                    last: None,
                    liveness_checked_ns: 0,
                    watch: ProgressWatch::default(),
                    live: ProgressWatch::default(),
                })
            })
            .collect();
        RdmaSource { scheme, fabric, nodes, config }
    }

    fn connect(&self, node: NodeId) -> Result<Arc<dyn RemoteRegion>, FabricError> {
        let region = self.fabric.connect(node, REGION_NAME)?;
        let mut magic = [0u8; 8];
        region.read(MAGIC_OFFSET, &mut magic)?;
        if u64::from_ne_bytes(magic) != MAGIC {
            return Err(FabricError::Protocol { node, reason: format!("{REGION_NAME} holds no load record") });
        }
        Ok(region)
    }

    fn read_value(&self, region: &dyn RemoteRegion) -> Result<LoadRecord, FabricError> {
        match self.scheme {
            Scheme::RdmaSync => {
                // The counters word and the progress word, adjacent: one read.
                const _: () = assert!(PROGRESS_OFFSET == COUNTERS_OFFSET + 8);
                let words = region.post(vec![Op::Read { offset: COUNTERS_OFFSET, len: 16 }]).wait()?;
                let bytes = words.into_iter().next().ok_or(FabricError::Closed)?.into_bytes()?;
                let word = |at: usize| -> Result<u64, FabricError> {
                    let mut eight = [0u8; 8];
                    eight.copy_from_slice(bytes.get(at..at + 8).ok_or(FabricError::Closed)?);
                    Ok(u64::from_ne_bytes(eight))
                };
                let counters = Counters::from_word(word(0)?);
                Ok(LoadRecord { t_ns: host_monotonic_ns(), counters, progress: word(8)?, ..LoadRecord::default() })
            }
            _ => {
                let (_, payload) = sampled_record().read(region)?;
                let mut words = [0u64; RECORD_WORDS];
                for (word, chunk) in words.iter_mut().zip(payload.chunks_exact(8)) {
                    let mut eight = [0u8; 8];
                    eight.copy_from_slice(chunk);
                    *word = u64::from_ne_bytes(eight);
                }
                Ok(LoadRecord::from_words(&words))
            }
        }
    }

    fn gone(&self, node: NodeId) -> bool {
        self.fabric.peer_state(node) == PeerState::Gone
    }
}

impl LoadSource for RdmaSource {
    fn scheme(&self) -> Scheme {
        self.scheme
    }

    fn len(&self) -> usize {
        self.nodes.len()
    }

    fn reads_wait_on_the_network(&self) -> bool {
        self.fabric.backend_name() != "shm"
    }

    fn read(&self, index: usize) -> Reading {
        let now = host_monotonic_ns();
        let Some(slot) = self.nodes.get(index) else { return Reading::unknown(now) };
        let Ok(mut state) = slot.lock() else { return Reading::unknown(now) };
        let node = state.node;
        let stale = |record: Option<LoadRecord>, health| Reading {
            record: record.unwrap_or_default(),
            read_ns: host_monotonic_ns(),
            health,
        };
        if !state.watch.may_read(now) {
            return stale(state.last, Health::Suspect);
        }
        let region = match state.region.clone() {
            Some(region) => region,
            None => match self.connect(node) {
                Ok(region) => {
                    state.region = Some(region.clone());
                    region
                }
                Err(e) => {
                    let dead = matches!(e, FabricError::PeerDead { .. }) || self.gone(node);
                    let health = if dead {
                        Health::Dead
                    } else if state.last.is_some() {
                        Health::Stale
                    } else {
                        Health::Unknown
                    };
                    return stale(state.last, health);
                }
            },
        };
        match self.read_value(region.as_ref()) {
            Ok(record) => {
                let read_ns = host_monotonic_ns();
                state.last = Some(record);
                let aged = Duration::from_nanos(read_ns.saturating_sub(record.t_ns)) > self.config.stale_after;
                let check_liveness = aged
                    || Duration::from_nanos(read_ns.saturating_sub(state.liveness_checked_ns))
                        >= self.config.liveness_every;
                if check_liveness {
                    state.liveness_checked_ns = read_ns;
                    if self.gone(node) {
                        state.region = None;
                        return Reading { record, read_ns, health: Health::Dead };
                    }
                }
                let bound = self.config.suspect_after_ns();
                let mut stalled = state.watch.stalled(record.progress, read_ns, bound);
                if stalled && self.scheme == Scheme::RdmaAsync {
                    // The sampler's record stands still: ask the live word
                    // (one more one-sided read, on this rare path only).
                    // The node is suspect only if that stands still too.
                    stalled = match region.read_u64(PROGRESS_OFFSET) {
                        Ok(live) => state.live.stalled(live, read_ns, bound),
                        Err(_) => true,
                    };
                }
                let health = if record.t_ns == 0 {
                    Health::Unknown // the sampler has not written yet
                } else if stalled {
                    Health::Suspect
                } else if aged {
                    Health::Stale
                } else {
                    Health::Fresh
                };
                Reading { record, read_ns, health }
            }
            Err(e) => {
                state.region = None;
                let dead = matches!(e, FabricError::PeerDead { .. }) || self.gone(node);
                let hung = matches!(e, FabricError::Timeout { .. });
                let health = match (dead, hung, self.config.suspect_after_ns()) {
                    (true, _, _) => Health::Dead,
                    (false, true, Some(bound)) => {
                        state.watch.hung(host_monotonic_ns(), bound);
                        Health::Suspect
                    }
                    _ => Health::Stale,
                };
                stale(state.last, health)
            }
        }
    }
}

// -------------------------------------------------------------- sockets ----

/// A connection that failed this way proves the node gone: nothing
/// listens (refused), or nothing accepted in time (a host that is down; a
/// stopped process still accepts into its backlog).
fn proves_gone(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::TimedOut | ErrorKind::WouldBlock)
}

/// A read or write that failed this way waited out its timeout.
fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock)
}

fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(stream)
}

fn read_frame(stream: &mut TcpStream) -> std::io::Result<LoadRecord> {
    let mut frame = [0u8; FRAME_BYTES];
    stream.read_exact(&mut frame)?;
    decode_frame(&frame).ok_or_else(|| std::io::Error::new(ErrorKind::InvalidData, "not a monitor frame"))
}

struct SyncNode {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    last: Option<LoadRecord>,
    watch: ProgressWatch,
}

/// Socket-Sync: a TCP request to the back end's monitor thread per read.
pub struct SocketSyncSource {
    nodes: Vec<Mutex<SyncNode>>,
    config: SourceConfig,
}

impl SocketSyncSource {
    pub fn new(sockets: Vec<SocketAddr>, config: SourceConfig) -> Self {
        let nodes = sockets
            .into_iter()
            .map(|addr| Mutex::new(SyncNode { addr, stream: None, last: None, watch: ProgressWatch::default() }))
            .collect();
        SocketSyncSource { nodes, config }
    }
}

impl LoadSource for SocketSyncSource {
    fn scheme(&self) -> Scheme {
        Scheme::SocketSync
    }

    fn len(&self) -> usize {
        self.nodes.len()
    }

    fn reads_wait_on_the_network(&self) -> bool {
        true
    }

    fn read(&self, index: usize) -> Reading {
        let now = host_monotonic_ns();
        let Some(slot) = self.nodes.get(index) else { return Reading::unknown(now) };
        let Ok(mut state) = slot.lock() else { return Reading::unknown(now) };
        if !state.watch.may_read(now) {
            return Reading { record: state.last.unwrap_or_default(), read_ns: now, health: Health::Suspect };
        }
        let suspect_after = self.config.suspect_after_ns();
        // A monitor thread that cannot answer within the suspicion bound is
        // suspect: waiting longer only stalls the reader.
        let answer_timeout = self.config.suspect_after.map_or(self.config.socket_timeout, |bound| {
            bound.min(self.config.socket_timeout).max(Duration::from_millis(1))
        });
        let (mut dead, mut hung) = (false, false);
        let answer = (|| {
            if state.stream.is_none() {
                let stream = connect(state.addr, self.config.socket_timeout).inspect_err(|e| dead = proves_gone(e))?;
                stream.set_read_timeout(Some(answer_timeout))?;
                state.stream = Some(stream);
            }
            let stream = state.stream.as_mut().ok_or_else(|| std::io::Error::from(ErrorKind::NotConnected))?;
            stream.write_all(&[REQUEST_SYNC])?;
            read_frame(stream).inspect_err(|e| hung = timed_out(e))
        })();
        let read_ns = host_monotonic_ns();
        match answer {
            Ok(record) => {
                state.last = Some(record);
                let stalled = state.watch.stalled(record.progress, read_ns, suspect_after);
                Reading { record, read_ns, health: if stalled { Health::Suspect } else { Health::Fresh } }
            }
            Err(_) => {
                // The connection is unusable (a late answer would be read as
                // the next one's); the next read reconnects, and a refusal
                // there proves the monitor (its process) gone.
                state.stream = None;
                let health = match (dead, hung, suspect_after) {
                    (true, _, _) => Health::Dead,
                    (false, true, Some(bound)) => {
                        state.watch.hung(read_ns, bound);
                        Health::Suspect
                    }
                    _ if state.last.is_some() => Health::Stale,
                    _ => Health::Unknown,
                };
                Reading { record: state.last.unwrap_or_default(), read_ns, health }
            }
        }
    }
}

#[derive(Default)]
struct AsyncSlot {
    last: Option<LoadRecord>,
    dead: bool,
    watch: ProgressWatch,
}

/// Socket-Async: a receiver thread per back end keeps the latest frame the
/// back end's monitor thread pushed.
pub struct SocketAsyncSource {
    slots: Vec<Arc<Mutex<AsyncSlot>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    config: SourceConfig,
}

impl SocketAsyncSource {
    pub fn start(sockets: Vec<SocketAddr>, config: SourceConfig) -> Result<Self, MonitorError> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut slots = Vec::new();
        let mut threads = Vec::new();
        for addr in sockets {
            let slot = Arc::new(Mutex::new(AsyncSlot::default()));
            let (receiving, stopping) = (slot.clone(), stop.clone());
            let thread = std::thread::Builder::new()
                .name("monitor-subscriber".into())
                .spawn(move || subscribe_loop(addr, receiving, stopping, config))
                .map_err(|e| MonitorError::Io(e.to_string()))?;
            slots.push(slot);
            threads.push(thread);
        }
        Ok(SocketAsyncSource { slots, stop, threads, config })
    }
}

impl Drop for SocketAsyncSource {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Receives frames from `addr` into `slot`, reconnecting after failures.
fn subscribe_loop(addr: SocketAddr, slot: Arc<Mutex<AsyncSlot>>, stop: Arc<AtomicBool>, config: SourceConfig) {
    // Short read timeouts, so the loop sees `stop` soon.
    let poll = config.stale_after.min(Duration::from_millis(100));
    while !stop.load(Ordering::Relaxed) {
        let stream = connect(addr, config.socket_timeout).and_then(|mut s| {
            s.set_read_timeout(Some(poll))?;
            s.write_all(&[REQUEST_SUBSCRIBE])?;
            Ok(s)
        });
        let mut stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                if let Ok(mut slot) = slot.lock() {
                    slot.dead = proves_gone(&e);
                }
                // Retry no faster than the staleness bound: a refusing node
                // is reported dead meanwhile.
                std::thread::sleep(poll);
                continue;
            }
        };
        if let Ok(mut slot) = slot.lock() {
            slot.dead = false;
        }
        let mut frame = [0u8; FRAME_BYTES];
        let mut filled = 0;
        while !stop.load(Ordering::Relaxed) {
            match stream.read(&mut frame[filled..]) {
                Ok(0) => break,
                Ok(n) => {
                    filled += n;
                    if filled == FRAME_BYTES {
                        filled = 0;
                        match decode_frame(&frame) {
                            Some(record) => {
                                if let Ok(mut slot) = slot.lock() {
                                    slot.last = Some(record);
                                }
                            }
                            None => break,
                        }
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
    }
}

impl LoadSource for SocketAsyncSource {
    fn scheme(&self) -> Scheme {
        Scheme::SocketAsync
    }

    fn len(&self) -> usize {
        self.slots.len()
    }

    fn read(&self, index: usize) -> Reading {
        let Some(Ok(mut slot)) = self.slots.get(index).map(|s| s.lock()) else {
            return Reading::unknown(host_monotonic_ns());
        };
        // Read the clock under the slot's lock: taken before it, the receiver
        // could install a record sampled after this "read" time.
        let read_ns = host_monotonic_ns();
        let Some(record) = slot.last else {
            let health = if slot.dead { Health::Dead } else { Health::Unknown };
            return Reading { record: LoadRecord::default(), read_ns, health };
        };
        let aged = Duration::from_nanos(read_ns.saturating_sub(record.t_ns)) > self.config.stale_after;
        // No new frame, or frames whose progress stands still: suspect.
        let stalled = slot.watch.stalled(record.progress, read_ns, self.config.suspect_after_ns());
        let health = if slot.dead {
            Health::Dead
        } else if stalled {
            Health::Suspect
        } else if aged {
            Health::Stale
        } else {
            Health::Fresh
        };
        Reading { record, read_ns, health }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_progress_word_standing_still_past_the_bound_is_stalled() {
        let mut watch = ProgressWatch::default();
        let bound = Some(100 * MS);
        assert!(!watch.stalled(5, 1_000 * MS, bound), "the first sight starts the clock");
        assert!(!watch.stalled(5, 1_100 * MS, bound), "exactly the bound: not yet");
        assert!(watch.stalled(5, 1_101 * MS, bound));
        assert!(!watch.stalled(6, 1_102 * MS, bound), "it moved: trusted again");
        assert!(!watch.stalled(6, 1_150 * MS, bound));
        assert!(!watch.stalled(6, 9_999 * MS, None), "no bound: never stalled");
    }

    #[test]
    fn a_node_that_keeps_no_heartbeat_is_never_stalled() {
        let mut watch = ProgressWatch::default();
        assert!(!watch.stalled(0, MS, Some(MS)));
        assert!(!watch.stalled(0, 1_000 * MS, Some(MS)));
    }

    #[test]
    fn after_a_hung_read_no_read_is_tried_within_the_bound() {
        let mut watch = ProgressWatch::default();
        assert!(watch.may_read(0));
        watch.hung(50 * MS, 100 * MS);
        assert!(!watch.may_read(50 * MS) && !watch.may_read(149 * MS));
        assert!(watch.may_read(150 * MS));
    }

    #[test]
    fn reads_that_hang_in_a_row_double_the_quiet_window_until_the_node_answers() {
        let mut watch = ProgressWatch::default();
        let mut now = 0;
        for doubling in 0..8u32 {
            watch.hung(now, 100 * MS);
            let window = (100 * MS) << doubling.min(HUNG_DOUBLINGS_MAX);
            assert!(!watch.may_read(now + window - 1) && watch.may_read(now + window), "hang {doubling}");
            now += window;
        }
        watch.stalled(7, now, Some(100 * MS)); // it answered
        watch.hung(now, 100 * MS);
        assert!(watch.may_read(now + 100 * MS), "an answer resets the back-off");
    }
}
