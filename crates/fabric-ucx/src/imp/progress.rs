//! The progress thread: the only thread that calls into the UCX worker.
//!
//! Everything else submits a [`Command`] ([`Submitter::submit`]: push on a
//! flume queue, then write the eventfd) and waits for its answer on a
//! bounded flume channel. UCX callbacks run inside `ucp_worker_progress`
//! on this thread; they only record what happened in a thread-local list
//! (`callbacks::EVENTS`), which the loop handles after progress returns, so no
//! callback ever touches the worker state that is borrowed while it runs.
//!
//! The loop (see the crate docs for why it cannot lose a wake-up):
//! progress until idle → handle events → drain commands (if any, go
//! round again) → expire deadlines → `ucp_worker_arm` (`UCS_ERR_BUSY`: go
//! round again) → `poll` the worker's fd and the submit eventfd, bounded
//! by the nearest deadline → clear the eventfd → round again.

mod callbacks;

use callbacks::{callback_param, on_am, on_ep_error, Event, EVENTS, RNDV};

use super::ucx::{status_error, status_text, Context};
use crate::imp::{SendReply, Shared};
use std::collections::HashMap;
use std::os::raw::c_int;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tierstack_base::time::instant_now;
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, CompletionSender, FabricError, Op, OpResult, Result};
use tierstack_ucx_sys as sys;

/// The active-message id of tierstack's messages and acknowledgements.
pub(crate) const AM_ID: u32 = 7;
/// Bytes of an active-message header: kind, channel, two zero bytes, the
/// sender's node id (`u32` LE), the message id (`u64` LE).
pub(crate) const AM_HEADER_BYTES: usize = 16;
pub(crate) const AM_MESSAGE: u8 = 1;
pub(crate) const AM_ACK: u8 = 2;

/// Progress calls in one burst before the loop looks at its queue again,
/// so a busy worker cannot starve submissions.
const PROGRESS_BURST_MAX: u32 = 256;
/// The most the idle loop polls the worker and its queue before it arms
/// the worker and sleeps: longer than an operation over UCX's shared-memory
/// transports, so back-to-back operations never pay a sleep and wake-up.
const IDLE_SPIN_MAX: Duration = Duration::from_micros(50);
/// The least it polls; the spin halves towards this each time it runs out
/// without finding work (an idle node soon costs almost nothing) and
/// doubles back each time work arrives while it spins.
const IDLE_SPIN_MIN: Duration = Duration::from_micros(2);
/// How long a caller waiting for a batch polls its completion before it
/// parks ([`tierstack_fabric::Completion::pending_spinning`]).
pub(crate) const CALLER_SPIN: Duration = Duration::from_micros(20);
/// How long shutdown lets UCX close endpoints before it gives up.
const CLOSE_BOUND: Duration = Duration::from_millis(500);

/// Work for the progress thread.
pub(crate) enum Command {
    /// Makes (or keeps) the endpoint to `node` for worker `address`.
    Connect {
        node: NodeId,
        generation: u64,
        address: Vec<u8>,
        reply: flume::Sender<Result<()>>,
    },
    /// Maps a region: `ucp_mem_map` (allocate), its address, its packed key.
    Map {
        bytes: u64,
        /// The widest rights any peer has on it: the mapping's protection.
        widest: tierstack_fabric::Rights,
        reply: flume::Sender<Result<Mapped>>,
    },
    /// Unmaps a region's memory handle (its last user went away).
    Unmap {
        memh: usize,
    },
    /// Unpacks a packed remote key on the endpoint to `node`.
    Unpack {
        node: NodeId,
        generation: u64,
        rkey: Vec<u8>,
        reply: flume::Sender<Result<u64>>,
    },
    DestroyRkey {
        id: u64,
    },
    /// Posts a validated batch on the region at `base` reached by `rkey`.
    Post {
        node: NodeId,
        generation: u64,
        rkey: u64,
        base: u64,
        ops: Vec<Op>,
        sender: CompletionSender,
    },
    /// Sends a message; `reply` answers when it is acknowledged (or fails).
    Send {
        node: NodeId,
        generation: u64,
        channel: Channel,
        payload: Vec<u8>,
        reply: SendReply,
    },
    /// Acknowledges message `msg_id` of `node` (it is in its inbox).
    Ack {
        node: NodeId,
        msg_id: u64,
    },
    /// The peer of `generation` is gone: fail what waits on it, close its endpoint.
    PeerGone {
        node: NodeId,
        generation: u64,
        reason: String,
    },
}

/// A region mapped by UCX.
pub(crate) struct Mapped {
    pub memh: usize,
    pub base: usize,
    pub rkey: Vec<u8>,
}

/// How other threads reach the progress thread.
pub(crate) struct Submitter {
    queue: flume::Sender<Command>,
    eventfd: c_int,
    /// Set by the progress thread (then a SeqCst fence, then a look at the
    /// queue) before it sleeps in `poll`, cleared when it wakes. A
    /// submitter queues, fences, and writes the eventfd only when this is
    /// set: with both fences, either the submitter sees the flag or the
    /// thread sees the command, so no wake-up is lost, and a spinning
    /// thread costs its submitters no system call.
    sleeping: AtomicBool,
}

impl Submitter {
    /// Queues `command` and wakes the progress thread. Fails with `Closed`
    /// once the thread has stopped (the command is handed back dropped,
    /// which fails its reply channel with `Closed` too).
    pub(crate) fn submit(&self, command: Command) -> Result<()> {
        self.queue.send(command).map_err(|_| FabricError::Closed)?;
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            self.wake();
        }
        Ok(())
    }

    pub(crate) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to our eventfd. A failure
        // (EAGAIN at the counter's maximum) still leaves the fd readable.
        unsafe { libc::write(self.eventfd, (&one as *const u64).cast(), 8) };
    }
}

impl Drop for Submitter {
    fn drop(&mut self) {
        // SAFETY: the eventfd is ours and closed once, here; the progress
        // thread holds an `Arc<Submitter>` while it polls it.
        unsafe { libc::close(self.eventfd) };
    }
}

struct Endpoint {
    ep: sys::ucp_ep_h,
    generation: u64,
    address: Vec<u8>,
}

/// The buffers an op needs until its batch completes.
enum Slot {
    None,
    Read(Vec<u8>),
    /// `[operand, reply]` of an atomic, boxed so its address is stable.
    Atomic(Box<[u64; 2]>),
}

struct Batch {
    node: NodeId,
    ops: Vec<Op>,
    slots: Vec<Slot>,
    /// `None` once the waiter was answered (timed out).
    sender: Option<CompletionSender>,
    deadline: Instant,
    /// An op that failed to post: reported when the flush completes.
    failed: Option<FabricError>,
}

struct Sending {
    node: NodeId,
    _header: Box<[u8; AM_HEADER_BYTES]>,
    _payload: Vec<u8>,
    /// For a message: its id, awaiting its acknowledgement.
    msg_id: Option<u64>,
}

struct AwaitingAck {
    node: NodeId,
    reply: SendReply,
    deadline: Instant,
}

/// The progress thread's state. Lives on that thread only.
pub(crate) struct Progress {
    shared: Arc<Shared>,
    context: Arc<Context>,
    worker: sys::ucp_worker_h,
    worker_fd: c_int,
    submitter: Arc<Submitter>,
    queue: flume::Receiver<Command>,
    endpoints: HashMap<NodeId, Endpoint>,
    rkeys: HashMap<u64, (NodeId, u64, sys::ucp_rkey_h)>,
    batches: HashMap<u64, Batch>,
    sending: HashMap<u64, Sending>,
    awaiting: HashMap<u64, AwaitingAck>,
    /// New endpoints being flushed (wired up) before their `Connect` answers.
    wiring: HashMap<u64, (NodeId, flume::Sender<Result<()>>)>,
    next_id: u64,
    /// Ask for `UCP_ERR_HANDLING_MODE_PEER` (see [`peer_failure_mode`]);
    /// cleared when the transports refuse it once.
    peer_mode: bool,
}

// SAFETY: the raw UCX handles are only used by the thread that runs
// `Progress::run`; the value is built on the opening thread and moved there
// before any of them is used concurrently.
unsafe impl Send for Progress {}

impl Progress {
    /// Creates the worker (single-threaded, RMA + AMO64 + AM, with wake-up
    /// events) and its active-message handler, the submit eventfd, and the
    /// endpoint to this node itself. Returns the state to run and the
    /// worker's address.
    pub(crate) fn new(
        shared: Arc<Shared>,
        context: Arc<Context>,
        transports: Option<&str>,
    ) -> Result<(Progress, Arc<Submitter>, Vec<u8>)> {
        // SAFETY: plain eventfd creation.
        let eventfd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if eventfd < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        let (tx, rx) = flume::unbounded();
        let submitter = Arc::new(Submitter { queue: tx, eventfd, sleeping: AtomicBool::new(false) });
        let worker = context.create_worker()?;
        let mut progress = Progress {
            shared,
            context,
            worker,
            worker_fd: -1,
            submitter: Arc::clone(&submitter),
            queue: rx,
            endpoints: HashMap::new(),
            rkeys: HashMap::new(),
            batches: HashMap::new(),
            sending: HashMap::new(),
            awaiting: HashMap::new(),
            wiring: HashMap::new(),
            next_id: 1,
            peer_mode: peer_failure_mode(transports),
        };
        // From here on, dropping `progress` destroys the worker.
        let mut fd: c_int = -1;
        // SAFETY: valid worker; `fd` is written by the call.
        check(unsafe { sys::ucp_worker_get_efd(progress.worker, &mut fd) }, "ucp_worker_get_efd")?;
        progress.worker_fd = fd;
        // SAFETY: zeroed is a valid value of this plain C struct.
        let mut handler: sys::ucp_am_handler_param_t = unsafe { std::mem::zeroed() };
        handler.field_mask = u64::from(
            sys::UCP_AM_HANDLER_PARAM_FIELD_ID
                | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
                | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG,
        );
        handler.id = AM_ID;
        handler.cb = Some(on_am);
        handler.arg = progress.worker.cast();
        // SAFETY: valid worker and handler parameters; the worker outlives
        // the handler (it is the handler's `arg`).
        check(unsafe { sys::ucp_worker_set_am_recv_handler(progress.worker, &handler) }, "set_am_recv_handler")?;
        let address = progress.worker_address()?;
        let local = progress.shared.node;
        progress.connect(local, 0, address.clone())?;
        Ok((progress, submitter, address))
    }

    fn worker_address(&self) -> Result<Vec<u8>> {
        let mut address: *mut sys::ucp_address_t = std::ptr::null_mut();
        let mut len: usize = 0;
        // SAFETY: valid worker; the out-pointers are written by the call.
        check(unsafe { sys::ucp_worker_get_address(self.worker, &mut address, &mut len) }, "ucp_worker_get_address")?;
        // SAFETY: UCX returned `len` bytes at `address`, released just below.
        let bytes = unsafe { std::slice::from_raw_parts(address.cast::<u8>(), len) }.to_vec();
        // SAFETY: releasing the address this worker gave us, once.
        unsafe { sys::ucp_worker_release_address(self.worker, address) };
        Ok(bytes)
    }

    /// The loop; returns when the fabric closes.
    pub(crate) fn run(mut self) {
        let mut spin = IDLE_SPIN_MAX;
        loop {
            let mut burst = 0;
            // SAFETY: the worker is used by this thread only.
            while unsafe { sys::ucp_worker_progress(self.worker) } != 0 && burst < PROGRESS_BURST_MAX {
                burst += 1;
            }
            self.handle_events();
            let mut worked = false;
            while let Ok(command) = self.queue.try_recv() {
                self.handle(command);
                worked = true;
            }
            self.handle_events();
            if self.shared.is_closed() {
                break;
            }
            self.expire(instant_now());
            if worked || burst == PROGRESS_BURST_MAX {
                continue;
            }
            // Idle: poll the worker and the queue for a bounded, adaptive
            // while before arming and sleeping (a sleep and wake-up costs
            // more than an operation over shared memory).
            if self.spin_for_work(spin) {
                spin = (spin * 2).min(IDLE_SPIN_MAX);
                continue;
            }
            spin = (spin / 2).max(IDLE_SPIN_MIN);
            // SAFETY: as above.
            let armed = unsafe { sys::ucp_worker_arm(self.worker) };
            if armed == sys::UCS_ERR_BUSY {
                continue;
            }
            if armed != sys::UCS_OK {
                tracing::warn!(status = %status_text(armed), "ucx: ucp_worker_arm failed; polling with a short bound");
            }
            self.submitter.sleeping.store(true, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            if !self.queue.is_empty() {
                self.submitter.sleeping.store(false, Ordering::Relaxed);
                continue;
            }
            let timeout = self.poll_timeout(armed == sys::UCS_OK);
            let mut fds = [
                libc::pollfd { fd: self.worker_fd, events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: self.submitter.eventfd, events: libc::POLLIN, revents: 0 },
            ];
            // SAFETY: two valid pollfd entries.
            unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
            self.submitter.sleeping.store(false, Ordering::Relaxed);
            if fds[1].revents != 0 {
                let mut counter: u64 = 0;
                // SAFETY: reading 8 bytes into a u64 from our non-blocking eventfd.
                unsafe { libc::read(self.submitter.eventfd, (&mut counter as *mut u64).cast(), 8) };
            }
        }
        self.teardown();
    }

    /// Polls the worker and the submit queue until either has work (true)
    /// or `spin` has passed (false).
    fn spin_for_work(&self, spin: Duration) -> bool {
        let start = instant_now();
        loop {
            // SAFETY: the worker is used by this thread only.
            if unsafe { sys::ucp_worker_progress(self.worker) } != 0 || !self.queue.is_empty() {
                return true;
            }
            if EVENTS.with(|events| !events.borrow().is_empty()) {
                return true;
            }
            if self.shared.is_closed() || start.elapsed() >= spin {
                return false;
            }
            // Yield rather than busy-wait: a caller pinned to this thread's
            // CPU (the bench pins both) gets to run, and so do other processes.
            std::thread::yield_now();
        }
    }

    /// Milliseconds `poll` may sleep: until the nearest deadline of a
    /// waiter, forever (-1) when nothing waits — so a lost wake-up would
    /// show as a stall up to a deadline, never be hidden by a periodic
    /// timer; 1 ms if the worker could not be armed.
    fn poll_timeout(&self, armed: bool) -> c_int {
        if !armed {
            return 1;
        }
        let now = instant_now();
        let nearest = self
            .batches
            .values()
            .filter(|b| b.sender.is_some())
            .map(|b| b.deadline)
            .chain(self.awaiting.values().map(|a| a.deadline))
            .min();
        match nearest {
            None => -1,
            // Round up so a deadline 0.5 ms away does not spin.
            Some(deadline) => c_int::try_from(deadline.saturating_duration_since(now).as_micros().div_ceil(1000))
                .unwrap_or(c_int::MAX),
        }
    }

    fn fresh_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Connect { node, generation, address, reply } => match self.connect(node, generation, address) {
                Ok(true) => self.wire(node, reply),
                Ok(false) => {
                    let _ = reply.send(Ok(()));
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Command::Map { bytes, widest, reply } => {
                let _ = reply.send(self.context.map(bytes, widest));
            }
            Command::Unmap { memh } => self.context.unmap(memh),
            Command::Unpack { node, generation, rkey, reply } => {
                let _ = reply.send(self.unpack(node, generation, &rkey));
            }
            Command::DestroyRkey { id } => {
                if let Some((_, _, rkey)) = self.rkeys.remove(&id) {
                    // SAFETY: an rkey we unpacked and destroy once (removed from the table).
                    unsafe { sys::ucp_rkey_destroy(rkey) };
                }
            }
            Command::Post { node, generation, rkey, base, ops, sender } => {
                self.post(node, generation, rkey, base, ops, sender)
            }
            Command::Send { node, generation, channel, payload, reply } => {
                self.send(node, generation, channel, payload, reply)
            }
            Command::Ack { node, msg_id } => {
                if let Some(generation) = self.endpoints.get(&node).map(|e| e.generation) {
                    self.send_am(node, generation, AM_ACK, 0, msg_id, Vec::new());
                }
            }
            Command::PeerGone { node, generation, reason } => {
                if self.endpoints.get(&node).is_some_and(|e| e.generation == generation) {
                    self.fail_peer(node, &reason);
                }
            }
        }
    }

    /// Makes the endpoint to `node`, or keeps the one it has for the same
    /// worker address (both sides of a hello ask for it).
    /// Returns whether it made a new endpoint.
    fn connect(&mut self, node: NodeId, generation: u64, address: Vec<u8>) -> Result<bool> {
        if let Some(existing) = self.endpoints.get_mut(&node) {
            if existing.address == address {
                existing.generation = existing.generation.max(generation);
                return Ok(false);
            }
            self.fail_peer(node, "replaced by a new process of the same node id");
        }
        // Peer-failure handling where the transports support it (UCX's
        // TCP and verbs transports do; its shared-memory ones and `self` do
        // not, and refuse the mode): the bootstrap watch covers those.
        let mut status = sys::UCS_OK;
        let mut ep: sys::ucp_ep_h = std::ptr::null_mut();
        let modes: &[sys::ucp_err_handling_mode_t] = if self.peer_mode {
            &[sys::UCP_ERR_HANDLING_MODE_PEER, sys::UCP_ERR_HANDLING_MODE_NONE]
        } else {
            &[sys::UCP_ERR_HANDLING_MODE_NONE]
        };
        for &mode in modes {
            // SAFETY: zeroed is a valid value of this plain C struct.
            let mut params: sys::ucp_ep_params_t = unsafe { std::mem::zeroed() };
            params.field_mask = u64::from(
                sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
                    | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                    | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER,
            );
            params.address = address.as_ptr().cast();
            params.err_mode = mode;
            params.err_handler.cb = Some(on_ep_error);
            // SAFETY: valid worker; `address` is a worker address from the
            // peer, valid for the call; `ep` is written by it.
            status = unsafe { sys::ucp_ep_create(self.worker, &params, &mut ep) };
            if status == sys::UCS_OK {
                break;
            }
            // Ask once per worker: UCX logs every refusal as an error.
            self.peer_mode = false;
        }
        if status != sys::UCS_OK {
            return Err(FabricError::PeerDead { node, reason: format!("ucp_ep_create: {}", status_text(status)) });
        }
        self.endpoints.insert(node, Endpoint { ep, generation, address });
        Ok(true)
    }

    /// Flushes a new endpoint and answers `reply` when the flush completes:
    /// the connection is then wired up on both sides before anyone uses it.
    /// (UCX 1.13's TCP transport aborts the process on an assertion when an
    /// endpoint fails while wire-up messages are still pending, which a
    /// peer closing right after a hello could otherwise cause.)
    fn wire(&mut self, node: NodeId, reply: flume::Sender<Result<()>>) {
        let Some(ep) = self.endpoints.get(&node).map(|e| e.ep) else {
            let _ = reply.send(Err(FabricError::PeerDead { node, reason: "its endpoint was closed".into() }));
            return;
        };
        let id = self.fresh_id();
        match sys::ucs_ptr_status(self.flush(ep, id)) {
            sys::PtrStatus::Done => {
                let _ = reply.send(Ok(()));
            }
            sys::PtrStatus::Error(s) => {
                let _ = reply.send(Err(status_error(node, s, "wiring up the endpoint")));
            }
            sys::PtrStatus::Request(_) => {
                self.wiring.insert(id, (node, reply));
            }
        }
    }

    fn unpack(&mut self, node: NodeId, generation: u64, packed: &[u8]) -> Result<u64> {
        let ep = self.endpoint(node, generation)?;
        let mut rkey: sys::ucp_rkey_h = std::ptr::null_mut();
        // SAFETY: valid endpoint; `packed` is a packed key from the peer's
        // bootstrap, valid for the call.
        let status = unsafe { sys::ucp_ep_rkey_unpack(ep, packed.as_ptr().cast(), &mut rkey) };
        if status != sys::UCS_OK {
            return Err(FabricError::Protocol { node, reason: format!("ucp_ep_rkey_unpack: {}", status_text(status)) });
        }
        let id = self.fresh_id();
        self.rkeys.insert(id, (node, generation, rkey));
        Ok(id)
    }

    fn endpoint(&self, node: NodeId, generation: u64) -> Result<sys::ucp_ep_h> {
        match self.endpoints.get(&node) {
            Some(e) if e.generation == generation || node == self.shared.node => Ok(e.ep),
            _ => Err(FabricError::PeerDead { node, reason: "its endpoint was closed".to_string() }),
        }
    }

    fn post(&mut self, node: NodeId, generation: u64, rkey_id: u64, base: u64, ops: Vec<Op>, sender: CompletionSender) {
        let ep = match self.endpoint(node, generation) {
            Ok(ep) => ep,
            Err(e) => return sender.complete(Err(e)),
        };
        let Some(&(_, _, rkey)) = self.rkeys.get(&rkey_id) else {
            return sender.complete(Err(FabricError::PeerDead { node, reason: "its region key was released".into() }));
        };
        let mut slots: Vec<Slot> = Vec::with_capacity(ops.len());
        let mut failed = None;
        for (i, op) in ops.iter().enumerate() {
            if i > 0 {
                // SAFETY: valid worker. Orders the ops of the batch.
                let status = unsafe { sys::ucp_worker_fence(self.worker) };
                if status != sys::UCS_OK {
                    failed = Some(status_error(node, status, "ucp_worker_fence"));
                    break;
                }
            }
            let (slot, status) = self.post_op(ep, rkey, base, op);
            slots.push(slot);
            match sys::ucs_ptr_status(status) {
                sys::PtrStatus::Done => {}
                // SAFETY: a request handle we do not track: release it; the
                // op goes on and the flush below covers its completion.
                sys::PtrStatus::Request(request) => unsafe { sys::ucp_request_free(request) },
                sys::PtrStatus::Error(s) => {
                    failed = Some(status_error(node, s, "posting an op"));
                    break;
                }
            }
        }
        let id = self.fresh_id();
        let deadline = instant_now() + self.shared.op_timeout;
        self.batches.insert(id, Batch { node, ops, slots, sender: Some(sender), deadline, failed });
        let status = self.flush(ep, id);
        match sys::ucs_ptr_status(status) {
            sys::PtrStatus::Done => self.finish_batch(id, sys::UCS_OK),
            sys::PtrStatus::Error(s) => self.finish_batch(id, s),
            sys::PtrStatus::Request(_) => {}
        }
    }

    fn flush(&self, ep: sys::ucp_ep_h, id: u64) -> sys::ucs_status_ptr_t {
        let param = callback_param(id);
        // SAFETY: valid endpoint and parameters; the callback frees the request.
        unsafe { sys::ucp_ep_flush_nbx(ep, &param) }
    }

    /// Posts one op; returns the buffers it uses and UCX's status pointer.
    fn post_op(&self, ep: sys::ucp_ep_h, rkey: sys::ucp_rkey_h, base: u64, op: &Op) -> (Slot, sys::ucs_status_ptr_t) {
        // SAFETY: zeroed is a valid value of this plain C struct (no fields set).
        let plain: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        let done = std::ptr::null_mut();
        match op {
            Op::Read { offset, len } => {
                let mut buffer = vec![0u8; *len as usize];
                if buffer.is_empty() {
                    return (Slot::Read(buffer), done);
                }
                // SAFETY: `buffer` (heap, kept in the batch until UCX is done)
                // has `len` bytes; the remote range was bounds-checked.
                let status = unsafe {
                    sys::ucp_get_nbx(ep, buffer.as_mut_ptr().cast(), buffer.len(), base + offset, rkey, &plain)
                };
                (Slot::Read(buffer), status)
            }
            Op::ReadInto { offset, target } => {
                // A bounce buffer: copied into the target only on success.
                let mut buffer = vec![0u8; target.len() as usize];
                if buffer.is_empty() {
                    return (Slot::Read(buffer), done);
                }
                // SAFETY: as for `Read`.
                let status = unsafe {
                    sys::ucp_get_nbx(ep, buffer.as_mut_ptr().cast(), buffer.len(), base + offset, rkey, &plain)
                };
                (Slot::Read(buffer), status)
            }
            Op::Write { offset, data } => {
                if data.is_empty() {
                    return (Slot::None, done);
                }
                // SAFETY: `data` lives in the batch's ops until UCX is done.
                let status =
                    unsafe { sys::ucp_put_nbx(ep, data.as_ptr().cast(), data.len(), base + offset, rkey, &plain) };
                (Slot::None, status)
            }
            Op::WriteFrom { offset, source } => {
                if source.is_empty() {
                    return (Slot::None, done);
                }
                // Straight from the registered source: no copy of ours.
                let Some(pointer) = slice_pointer(source) else {
                    return (Slot::None, done);
                };
                // SAFETY: `pointer` addresses `source.len()` bytes of a local
                // region kept alive by the `LocalSlice` in the batch's ops
                // (bounds checked by `check_batch`).
                let status =
                    unsafe { sys::ucp_put_nbx(ep, pointer.cast(), source.len() as usize, base + offset, rkey, &plain) };
                (Slot::None, status)
            }
            Op::FetchAdd { offset, delta } => {
                self.post_atomic(ep, rkey, base + offset, sys::UCP_ATOMIC_OP_ADD, [*delta, 0])
            }
            // UCX's compare-swap: `buffer` holds the value compared with,
            // `reply_buffer` the value swapped in, then the previous value.
            Op::CompareSwap { offset, expected, new } => {
                self.post_atomic(ep, rkey, base + offset, sys::UCP_ATOMIC_OP_CSWAP, [*expected, *new])
            }
        }
    }

    fn post_atomic(
        &self,
        ep: sys::ucp_ep_h,
        rkey: sys::ucp_rkey_h,
        remote: u64,
        opcode: sys::ucp_atomic_op_t,
        values: [u64; 2],
    ) -> (Slot, sys::ucs_status_ptr_t) {
        let mut words = Box::new(values);
        // SAFETY: zeroed is a valid value of this plain C struct.
        let mut param: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        param.op_attr_mask = sys::UCP_OP_ATTR_FIELD_DATATYPE | sys::UCP_OP_ATTR_FIELD_REPLY_BUFFER;
        param.datatype = sys::ucp_dt_make_contig(8);
        param.reply_buffer = (&mut words[1] as *mut u64).cast();
        // SAFETY: operand and reply are 8-byte words in a box kept in the
        // batch until UCX is done; the remote word was checked (aligned, in bounds).
        let status =
            unsafe { sys::ucp_atomic_op_nbx(ep, opcode, (&words[0] as *const u64).cast(), 1, remote, rkey, &param) };
        (Slot::Atomic(words), status)
    }

    /// A flush (batch) finished with `status`: answers its waiter, if it
    /// still waits, and frees its buffers.
    fn finish_batch(&mut self, id: u64, status: sys::ucs_status_t) {
        let Some(batch) = self.batches.remove(&id) else { return };
        let Some(sender) = batch.sender else { return };
        let node = batch.node;
        if let Some(error) = batch.failed {
            return sender.complete(Err(error));
        }
        if status != sys::UCS_OK {
            return sender.complete(Err(status_error(node, status, "batch")));
        }
        let results = batch
            .ops
            .iter()
            .zip(batch.slots)
            .map(|(op, slot)| match (op, slot) {
                (Op::Read { .. }, Slot::Read(data)) => Ok(OpResult::Read(data)),
                (Op::ReadInto { target, .. }, Slot::Read(data)) => {
                    target.region().memory().write(target.offset(), &data)?;
                    Ok(OpResult::ReadInto)
                }
                (Op::Write { .. }, _) => Ok(OpResult::Written),
                (Op::WriteFrom { .. }, _) => Ok(OpResult::WrittenFrom),
                (Op::FetchAdd { .. }, Slot::Atomic(words)) => Ok(OpResult::FetchAdd(words[1])),
                (Op::CompareSwap { .. }, Slot::Atomic(words)) => Ok(OpResult::CompareSwap(words[1])),
                _ => Err(FabricError::Protocol { node, reason: "an op lost its buffer".to_string() }),
            })
            .collect();
        sender.complete(results);
    }

    fn send(&mut self, node: NodeId, generation: u64, channel: Channel, payload: Vec<u8>, reply: SendReply) {
        if let Err(e) = self.endpoint(node, generation) {
            reply.answer(Err(e));
            return;
        }
        let msg_id = self.fresh_id();
        let deadline = instant_now() + self.shared.op_timeout;
        self.awaiting.insert(msg_id, AwaitingAck { node, reply, deadline });
        self.send_am(node, generation, AM_MESSAGE, channel.id(), msg_id, payload);
    }

    /// Sends an active message (a message, or the acknowledgement of one).
    fn send_am(&mut self, node: NodeId, generation: u64, kind: u8, channel: u8, msg_id: u64, payload: Vec<u8>) {
        let Ok(ep) = self.endpoint(node, generation) else { return self.fail_send(msg_id, kind, node, None) };
        let mut header = Box::new([0u8; AM_HEADER_BYTES]);
        header[0] = kind;
        header[1] = channel;
        header[4..8].copy_from_slice(&self.shared.node.0.to_le_bytes());
        header[8..16].copy_from_slice(&msg_id.to_le_bytes());
        let id = self.fresh_id();
        let mut param = callback_param(id);
        param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = sys::UCP_AM_SEND_FLAG_EAGER;
        // SAFETY: valid endpoint; header and payload are heap buffers kept
        // in `sending` until the callback (or freed at once if none comes).
        let status = unsafe {
            sys::ucp_am_send_nbx(
                ep,
                AM_ID,
                header.as_ptr().cast(),
                AM_HEADER_BYTES,
                payload.as_ptr().cast(),
                payload.len(),
                &param,
            )
        };
        let msg = (kind == AM_MESSAGE).then_some(msg_id);
        match sys::ucs_ptr_status(status) {
            sys::PtrStatus::Done => {}
            sys::PtrStatus::Error(s) => self.fail_send(msg_id, kind, node, Some(s)),
            sys::PtrStatus::Request(_) => {
                self.sending.insert(id, Sending { node, _header: header, _payload: payload, msg_id: msg });
            }
        }
    }

    fn fail_send(&mut self, msg_id: u64, kind: u8, node: NodeId, status: Option<sys::ucs_status_t>) {
        if kind != AM_MESSAGE {
            tracing::debug!(%node, "ucx: an acknowledgement could not be sent");
            return;
        }
        if let Some(waiting) = self.awaiting.remove(&msg_id) {
            let error = status.map_or_else(
                || FabricError::PeerDead { node, reason: "its endpoint was closed".to_string() },
                |s| status_error(node, s, "sending a message"),
            );
            waiting.reply.answer(Err(error));
        }
    }

    fn handle_events(&mut self) {
        loop {
            let events = EVENTS.with(|events| std::mem::take(&mut *events.borrow_mut()));
            if events.is_empty() {
                return;
            }
            for event in events {
                match event {
                    Event::Done { id, status } => {
                        if let Some((node, reply)) = self.wiring.remove(&id) {
                            let result =
                                if status == sys::UCS_OK { Ok(()) } else { Err(status_error(node, status, "wire-up")) };
                            let _ = reply.send(result);
                        } else if let Some(sent) = self.sending.remove(&id) {
                            if status != sys::UCS_OK {
                                if let Some(msg_id) = sent.msg_id {
                                    self.fail_send(msg_id, AM_MESSAGE, sent.node, Some(status));
                                }
                            }
                        } else {
                            self.finish_batch(id, status);
                        }
                    }
                    Event::Am { header, payload } => self.arrived(header, payload),
                    Event::RndvDone { id, status } => {
                        if let Some((header, payload)) = RNDV.with(|r| r.borrow_mut().remove(&id)) {
                            if status == sys::UCS_OK {
                                self.arrived(header, payload);
                            }
                        }
                    }
                    Event::EpError { ep, status } => {
                        let node = self.endpoints.iter().find(|(_, e)| e.ep as usize == ep).map(|(n, _)| *n);
                        if let Some(node) = node {
                            let reason = format!("UCX endpoint error: {}", status_text(status));
                            self.shared.mark_dead(node, &reason);
                            self.fail_peer(node, &reason);
                        }
                    }
                }
            }
        }
    }

    fn arrived(&mut self, header: [u8; AM_HEADER_BYTES], payload: Vec<u8>) {
        let from = NodeId(u32::from_le_bytes([header[4], header[5], header[6], header[7]]));
        let msg_id = u64::from_le_bytes([
            header[8], header[9], header[10], header[11], header[12], header[13], header[14], header[15],
        ]);
        match header[0] {
            AM_ACK => {
                if let Some(waiting) = self.awaiting.remove(&msg_id) {
                    if waiting.node == from {
                        waiting.reply.answer(Ok(()));
                    } else {
                        self.awaiting.insert(msg_id, waiting);
                    }
                }
            }
            AM_MESSAGE => {
                let Ok(channel) = Channel::new(header[1]) else {
                    tracing::warn!(%from, channel = header[1], "ucx: a message on an unknown channel was dropped");
                    return;
                };
                if self.shared.deliver_now(from, channel, msg_id, payload) {
                    if let Some(generation) = self.endpoints.get(&from).map(|e| e.generation) {
                        self.send_am(from, generation, AM_ACK, 0, msg_id, Vec::new());
                    }
                }
            }
            other => tracing::warn!(%from, kind = other, "ucx: an active message of unknown kind was dropped"),
        }
    }

    /// Answers waiters whose deadline passed with `Timeout`. A timed-out
    /// batch keeps its buffers until UCX completes or fails it.
    fn expire(&mut self, now: Instant) {
        let timeout_ms = u64::try_from(self.shared.op_timeout.as_millis()).unwrap_or(u64::MAX);
        for batch in self.batches.values_mut() {
            if batch.deadline <= now {
                if let Some(sender) = batch.sender.take() {
                    sender.complete(Err(FabricError::Timeout { node: batch.node, timeout_ms }));
                }
            }
        }
        let expired: Vec<u64> = self.awaiting.iter().filter(|(_, a)| a.deadline <= now).map(|(id, _)| *id).collect();
        for id in expired {
            if let Some(waiting) = self.awaiting.remove(&id) {
                waiting.reply.answer(Err(FabricError::Timeout { node: waiting.node, timeout_ms }));
            }
        }
    }

    /// Fails everything that waits on `node`, destroys its keys and closes
    /// its endpoint (forcibly: the peer is gone). UCX completes the
    /// endpoint's outstanding requests with errors, which free their buffers.
    fn fail_peer(&mut self, node: NodeId, reason: &str) {
        let dead = || FabricError::PeerDead { node, reason: reason.to_string() };
        for batch in self.batches.values_mut().filter(|b| b.node == node) {
            if let Some(sender) = batch.sender.take() {
                sender.complete(Err(dead()));
            }
        }
        let waiting: Vec<u64> = self.awaiting.iter().filter(|(_, a)| a.node == node).map(|(id, _)| *id).collect();
        for id in waiting {
            if let Some(a) = self.awaiting.remove(&id) {
                a.reply.answer(Err(dead()));
            }
        }
        let keys: Vec<u64> = self.rkeys.iter().filter(|(_, (n, _, _))| *n == node).map(|(id, _)| *id).collect();
        for id in keys {
            if let Some((_, _, rkey)) = self.rkeys.remove(&id) {
                // SAFETY: an rkey we unpacked, destroyed once (removed from the table).
                unsafe { sys::ucp_rkey_destroy(rkey) };
            }
        }
        if let Some(endpoint) = self.endpoints.remove(&node) {
            self.close_endpoint(endpoint.ep);
        }
    }

    fn close_endpoint(&mut self, ep: sys::ucp_ep_h) {
        // SAFETY: zeroed is a valid value of this plain C struct.
        let mut param: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        param.op_attr_mask = sys::UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = sys::UCP_EP_CLOSE_FLAG_FORCE;
        // SAFETY: an endpoint of ours, closed once (removed from the table).
        let status = unsafe { sys::ucp_ep_close_nbx(ep, &param) };
        if let sys::PtrStatus::Request(request) = sys::ucs_ptr_status(status) {
            let until = instant_now() + CLOSE_BOUND;
            // SAFETY: polling the request UCX returned, on the worker's thread.
            while unsafe { sys::ucp_request_check_status(request) } == sys::UCS_INPROGRESS && instant_now() < until {
                // SAFETY: as in `run`.
                unsafe { sys::ucp_worker_progress(self.worker) };
            }
            // SAFETY: releasing the close request once.
            unsafe { sys::ucp_request_free(request) };
        }
    }

    /// Fails what waits with `Closed`, unmaps what was queued for it, and
    /// closes every endpoint; the worker is destroyed on drop.
    fn teardown(&mut self) {
        for batch in self.batches.values_mut() {
            if let Some(sender) = batch.sender.take() {
                sender.complete(Err(FabricError::Closed));
            }
        }
        for (_, waiting) in self.awaiting.drain() {
            waiting.reply.answer(Err(FabricError::Closed));
        }
        while let Ok(command) = self.queue.try_recv() {
            if let Command::Unmap { memh } = command {
                self.context.unmap(memh);
            }
        }
        for (_, (_, _, rkey)) in self.rkeys.drain() {
            // SAFETY: as in `fail_peer`.
            unsafe { sys::ucp_rkey_destroy(rkey) };
        }
        let endpoints: Vec<Endpoint> = self.endpoints.drain().map(|(_, e)| e).collect();
        for endpoint in endpoints {
            self.close_endpoint(endpoint.ep);
        }
        self.handle_events();
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // Buffers of requests UCX still holds are freed with the batches
        // below, after the worker (and with it every request) is gone.
        // SAFETY: the worker is ours, destroyed once, after its endpoints.
        unsafe { sys::ucp_worker_destroy(self.worker) };
        self.batches.clear();
        self.sending.clear();
        EVENTS.with(|events| events.borrow_mut().clear());
        RNDV.with(|r| r.borrow_mut().clear());
    }
}

/// Whether to ask UCX for peer-failure handling: only when the transports
/// are named (`UCX_TLS` or the configuration) and none is a shared-memory
/// one. UCX's shared-memory transports refuse the mode, and UCX prints the
/// refusal as an error on standard output (where a node's `ready` line
/// goes); a peer's death is seen by the bootstrap watch in every case.
fn peer_failure_mode(transports: Option<&str>) -> bool {
    let named = transports.map(str::to_string).or_else(|| std::env::var("UCX_TLS").ok());
    let Some(named) = named else { return false };
    const SHARED_MEMORY: [&str; 8] = ["sysv", "posix", "cma", "knem", "xpmem", "sm", "shm", "all"];
    !named.split(',').map(|t| t.trim().trim_start_matches('^')).any(|t| SHARED_MEMORY.contains(&t))
}

/// The address of a local slice's first byte, through the region's
/// word view (the slice was bounds-checked by `check_batch`).
fn slice_pointer(slice: &tierstack_fabric::LocalSlice) -> Option<*const u8> {
    let start = slice.offset() - slice.offset() % 8;
    let words = slice.region().memory().words(start, 1).ok()?;
    // SAFETY: `start + offset % 8` lies in the region (checked above and by
    // `check_batch`); the pointer is only handed to UCX as a source.
    Some(unsafe { words.as_ptr().cast::<u8>().add((slice.offset() % 8) as usize) })
}

fn check(status: sys::ucs_status_t, what: &str) -> Result<()> {
    if status == sys::UCS_OK {
        Ok(())
    } else {
        Err(FabricError::Io(format!("{what}: {}", status_text(status))))
    }
}
