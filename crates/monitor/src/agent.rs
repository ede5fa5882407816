//! The monitored node's monitor thread and socket server: the part of the
//! three schemes other than RDMA-Sync that must run **on the back end**.
//!
//! - **RDMA-Async**: every `interval` the monitor thread samples `/proc` and
//!   writes the seqlock record of `monitor.load` (read one-sidedly).
//! - **Socket-Async**: on the same tick it sends the record to every front end
//!   that subscribed over TCP.
//! - **Socket-Sync**: a thread per front-end connection answers each request
//!   with the counters at that moment (and the last kernel sample).
//!
//! Socket protocol (TCP): the front end sends one byte, [`REQUEST_SYNC`]
//! (answered by one frame; repeatable) or [`REQUEST_SUBSCRIBE`] (then frames
//! arrive every interval). A frame is [`FRAME_BYTES`] bytes: [`FRAME_MAGIC`]
//! then the record's seven words, little-endian.

use crate::publisher::LoadPublisher;
use crate::record::{KernelSample, LoadRecord, RECORD_WORDS};
use crate::sampler::KernelSampler;
use crate::MonitorError;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use tierstack_base::host_monotonic_ns;
use tierstack_base::time::instant_now;

/// Asks for one frame now.
pub const REQUEST_SYNC: u8 = b'S';
/// Asks for a frame every interval from now on.
pub const REQUEST_SUBSCRIBE: u8 = b'A';
/// `"tsmonfr2"`, the first word of every frame (2: with the progress word).
pub const FRAME_MAGIC: u64 = u64::from_le_bytes(*b"tsmonfr2");
pub const FRAME_BYTES: usize = 8 + RECORD_WORDS * 8;
/// Longest the monitor thread waits on one subscriber's socket.
const SEND_TIMEOUT: Duration = Duration::from_millis(50);
/// How often an idle connection thread looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);

/// Encodes a frame.
pub fn encode_frame(record: &LoadRecord) -> [u8; FRAME_BYTES] {
    let mut frame = [0u8; FRAME_BYTES];
    frame[..8].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
    frame[8..].copy_from_slice(&record.to_le_bytes());
    frame
}

/// Decodes a frame; `None` if its magic is wrong.
pub fn decode_frame(frame: &[u8; FRAME_BYTES]) -> Option<LoadRecord> {
    let mut magic = [0u8; 8];
    magic.copy_from_slice(&frame[..8]);
    if u64::from_le_bytes(magic) != FRAME_MAGIC {
        return None;
    }
    let mut record = [0u8; RECORD_WORDS * 8];
    record.copy_from_slice(&frame[8..]);
    Some(LoadRecord::from_le_bytes(&record))
}

/// What the monitor thread and the socket server do.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The monitor thread's period (RDMA-Async record, Socket-Async frames).
    pub interval: Duration,
    /// Write the seqlock record every tick (RDMA-Async).
    pub write_record: bool,
    /// Where the socket server listens; `None`: no socket schemes.
    pub socket_listen: Option<SocketAddr>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig { interval: Duration::from_millis(10), write_record: true, socket_listen: None }
    }
}

struct Shared {
    publisher: Arc<LoadPublisher>,
    stop: AtomicBool,
    kernel: Mutex<KernelSample>,
    subscribers: Mutex<Vec<TcpStream>>,
    counts: AgentCounters,
}

/// What the agent did, counted with relaxed atomics (see [`AgentStats`]).
#[derive(Default)]
struct AgentCounters {
    sync_reads: AtomicU64,
    frames_pushed: AtomicU64,
    records_written: AtomicU64,
    record_errors: AtomicU64,
    subscribers: AtomicU64,
}

/// What a monitor agent has served since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentStats {
    /// Socket-Sync requests answered (one frame each).
    pub sync_reads: u64,
    /// Socket-Async frames sent to subscribers.
    pub frames_pushed: u64,
    /// RDMA-Async records written (what one-sided readers read; their
    /// reads themselves take no CPU here and are not counted).
    pub records_written: u64,
    /// Records that could not be written.
    pub record_errors: u64,
    /// Socket-Async subscribers now.
    pub subscribers: u64,
}

/// A running agent's counters and load, readable from another thread (a
/// metrics listener) while the agent runs.
#[derive(Clone)]
pub struct AgentView(Arc<Shared>);

impl AgentView {
    pub fn stats(&self) -> AgentStats {
        let c = &self.0.counts;
        AgentStats {
            sync_reads: c.sync_reads.load(Ordering::Relaxed),
            frames_pushed: c.frames_pushed.load(Ordering::Relaxed),
            records_written: c.records_written.load(Ordering::Relaxed),
            record_errors: c.record_errors.load(Ordering::Relaxed),
            subscribers: c.subscribers.load(Ordering::Relaxed),
        }
    }

    /// The load now: the counters, and the last kernel sample.
    pub fn record(&self) -> LoadRecord {
        self.0.record_now()
    }

    /// Whether the agent's threads still run.
    pub fn running(&self) -> bool {
        !self.0.stop.load(Ordering::Relaxed)
    }
}

impl Shared {
    fn record_now(&self) -> LoadRecord {
        let kernel = self.kernel.lock().map(|k| *k).unwrap_or_default();
        let publisher = &self.publisher;
        LoadRecord { t_ns: host_monotonic_ns(), counters: publisher.counters(), progress: publisher.progress(), kernel }
    }
}

/// The running monitor thread and socket server of one node; stops and
/// joins its threads when dropped.
pub struct MonitorAgent {
    shared: Arc<Shared>,
    socket_addr: Option<SocketAddr>,
    threads: Vec<JoinHandle<()>>,
}

impl MonitorAgent {
    pub fn start(publisher: Arc<LoadPublisher>, config: AgentConfig) -> Result<MonitorAgent, MonitorError> {
        if config.interval.is_zero() {
            return Err(MonitorError::BadConfig("the monitor interval must be above zero".into()));
        }
        let shared = Arc::new(Shared {
            publisher,
            stop: AtomicBool::new(false),
            kernel: Mutex::new(KernelSample::default()),
            subscribers: Mutex::new(Vec::new()),
            counts: AgentCounters::default(),
        });
        let mut threads = Vec::new();
        let mut socket_addr = None;
        if let Some(listen) = config.socket_listen {
            let listener =
                TcpListener::bind(listen).map_err(|e| MonitorError::Io(format!("listen on {listen}: {e}")))?;
            let addr = listener.local_addr().map_err(|e| MonitorError::Io(e.to_string()))?;
            socket_addr = Some(addr);
            let shared = shared.clone();
            threads.push(spawn("monitor-accept", move || accept_loop(listener, shared))?);
        }
        let ticking = shared.clone();
        threads.push(spawn("monitor-tick", move || tick_loop(ticking, config.interval, config.write_record))?);
        Ok(MonitorAgent { shared, socket_addr, threads })
    }

    /// The socket server's address, if it has one.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        self.socket_addr
    }

    /// Its counters and load, for a metrics listener.
    pub fn view(&self) -> AgentView {
        AgentView(self.shared.clone())
    }
}

impl Drop for MonitorAgent {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(addr) = self.socket_addr {
            // Wakes the acceptor out of accept().
            let _ = TcpStream::connect_timeout(&addr, Duration::from_millis(200));
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn spawn(name: &str, body: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, MonitorError> {
    std::thread::Builder::new().name(name.into()).spawn(body).map_err(|e| MonitorError::Io(e.to_string()))
}

/// Every `interval`: sample the kernel, write the record, feed subscribers.
fn tick_loop(shared: Arc<Shared>, interval: Duration, write_record: bool) {
    let mut sampler = KernelSampler::new();
    let mut next = instant_now();
    while !shared.stop.load(Ordering::Relaxed) {
        let kernel = sampler.sample();
        if let Ok(mut latest) = shared.kernel.lock() {
            *latest = kernel;
        }
        if write_record {
            match shared.publisher.write_record(kernel, host_monotonic_ns()) {
                Ok(_) => shared.counts.records_written.fetch_add(1, Ordering::Relaxed),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot write the load record");
                    shared.counts.record_errors.fetch_add(1, Ordering::Relaxed)
                }
            };
        }
        if let Ok(mut subscribers) = shared.subscribers.lock() {
            if !subscribers.is_empty() {
                let frame = encode_frame(&shared.record_now());
                subscribers.retain_mut(|stream| stream.write_all(&frame).is_ok());
                let sent = subscribers.len() as u64;
                shared.counts.frames_pushed.fetch_add(sent, Ordering::Relaxed);
                shared.counts.subscribers.store(sent, Ordering::Relaxed);
            }
        }
        // The period is the monitor thread's: when it is starved of CPU its
        // samples age, which is exactly what the async schemes suffer.
        next += interval;
        let now = instant_now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let _ = stream.set_nodelay(true);
        let serving = shared.clone();
        if let Err(e) = spawn("monitor-conn", move || serve_connection(stream, serving)) {
            tracing::warn!(error = %e, "cannot serve a monitor connection");
        }
    }
}

/// Answers sync requests until the peer leaves; hands a subscriber over to
/// the monitor thread.
fn serve_connection(mut stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_read_timeout(Some(STOP_POLL));
    let _ = stream.set_write_timeout(Some(SEND_TIMEOUT));
    let mut request = [0u8; 1];
    while !shared.stop.load(Ordering::Relaxed) {
        match stream.read(&mut request) {
            Ok(0) => return,
            Ok(_) if request[0] == REQUEST_SYNC => {
                if stream.write_all(&encode_frame(&shared.record_now())).is_err() {
                    return;
                }
                shared.counts.sync_reads.fetch_add(1, Ordering::Relaxed);
            }
            Ok(_) if request[0] == REQUEST_SUBSCRIBE => {
                if let Ok(mut subscribers) = shared.subscribers.lock() {
                    subscribers.push(stream);
                    shared.counts.subscribers.store(subscribers.len() as u64, Ordering::Relaxed);
                }
                return;
            }
            Ok(_) => return, // not our protocol
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Counters;

    #[test]
    fn frames_round_trip_and_a_wrong_magic_is_refused() {
        let record = LoadRecord {
            t_ns: 5,
            counters: Counters { running_threads: 1, open_connections: 2, in_flight_requests: 3, queue_len: 4 },
            progress: 77,
            kernel: KernelSample { procs_running: Some(9), ..KernelSample::default() },
        };
        let frame = encode_frame(&record);
        assert_eq!(decode_frame(&frame), Some(record));
        let mut bad = frame;
        bad[0] ^= 1;
        assert_eq!(decode_frame(&bad), None);
    }

    #[test]
    fn a_zero_interval_is_refused() {
        let publisher = LoadPublisher::unregistered().unwrap();
        let config = AgentConfig { interval: Duration::ZERO, ..AgentConfig::default() };
        assert!(matches!(MonitorAgent::start(publisher, config), Err(MonitorError::BadConfig(_))));
    }
}
