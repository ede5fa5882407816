//! The intra-cluster link: PRESS messages over the fabric's message
//! channel (`Channel::PRESS`), counted per type (Table 2), with the Base
//! version's window flow control.
//!
//! - **TCP** (`tcp`): `Fabric::send` on the `tcp` backend: kernel TCP, a
//!   reader thread and an inbox at the receiver. No flow-control messages:
//!   "implemented transparently to the server by TCP itself" (§3.2).
//! - **Base** (`base`): `Fabric::send` on the `shm` backend: two-sided
//!   messages through shared-memory rings, copied in at the sender and out
//!   at the receiver, as VIA's send/receive. On top, PRESS's own window
//!   flow control: a sender holds at most `window` unacknowledged messages
//!   per receiver (every type but `Flow`), and a receiver returns credits in
//!   a `Flow` message once it consumed half a window from that sender, sent
//!   by a thread of its own (the paper's send thread) so that the receive
//!   thread never blocks on a full peer. A
//!   receiver that stops consuming therefore stops its senders after
//!   `window` messages: they wait (bounded) instead of overrunning it.
//!   Those `Flow` messages are all Base sends for flow control: the paper's
//!   Base moves every file in one regular message copied out at once at
//!   the receiver, so no buffer stays in use to be announced, and its
//!   Table 2 shows it: Base's Flow messages average 4.0 bytes, a credit
//!   count alone, where a buffer-management message carries an address and
//!   a size. Buffer management is the remote-write versions' second message
//!   per file (the `released` word in `rings`), as §4.2 explains.
//!
//! **Every receiver waits the same way** (issue 33): with nothing to take,
//! it waits in the fabric's inbox wait (`Link::receive` here for TCP and
//! Base; the ring versions' poll thread waits on its doorbell channel, see
//! `rings`). On `shm` that wait spins adaptively for at most the fabric's
//! `receive_spin` (50 µs by default), then sleeps on a futex that the
//! sender wakes; on `tcp` the kernel wakes the reader thread and the inbox
//! wakes the receiver. The waits and wake-ups are counted ([`LinkStats`]).

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;
use tierstack_base::time::instant_now;
use tierstack_base::NodeId;
use tierstack_fabric::{Channel, Fabric, FabricError, Inbox, TrySend};
use tierstack_press::proto::{encode, Body, Message, MsgType, ProtoError};
use tierstack_press::{Branch, Counters, Member};

/// Default flow-control window (messages in flight per ordered pair).
pub const WINDOW_DEFAULT: u32 = 32;

/// The communication version a node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportKind {
    Tcp,
    Base,
    /// One-sided writes into per-pair rings, one copy at the receiver.
    Rdma1c,
    /// As RDMA-1c, the reply served to the client straight from the ring.
    Rdma,
    /// As RDMA, the file written from the sender's registered cache.
    Zero,
}

impl TransportKind {
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Base => "base",
            TransportKind::Rdma1c => "rdma-1c",
            TransportKind::Rdma => "rdma",
            TransportKind::Zero => "zero",
        }
    }

    /// The fabric backend this version runs over (`shm` is the one-sided
    /// stand-in for RDMA on one host).
    pub fn backend(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Base | TransportKind::Rdma1c | TransportKind::Rdma | TransportKind::Zero => "shm",
        }
    }
}

impl std::str::FromStr for TransportKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tcp" => Ok(TransportKind::Tcp),
            "base" => Ok(TransportKind::Base),
            "rdma-1c" => Ok(TransportKind::Rdma1c),
            "rdma" => Ok(TransportKind::Rdma),
            "zero" => Ok(TransportKind::Zero),
            other => Err(format!("unknown transport {other:?} (expected tcp, base, rdma-1c, rdma or zero)")),
        }
    }
}

/// A message that could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error(transparent)]
    Encode(#[from] ProtoError),
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error("no flow-control credit from {to} within {waited_ms} ms (its receiver is not consuming)")]
    NoCredit { to: Member, waited_ms: u64 },
    #[error("a message of {bytes} bytes does not fit the rings")]
    TooLarge { bytes: u64 },
    #[error("starting the credit sender thread: {0}")]
    Thread(std::io::Error),
}

/// How a node's receiver waited and woke, and how its Zero files went out
/// (shared by the link's threads).
#[derive(Debug, Default)]
pub struct LinkCounters {
    pub idle_waits: AtomicU64,
    pub woken: AtomicU64,
    pub doorbells: AtomicU64,
    pub files_from_slab: AtomicU64,
    /// Client requests by the line of Fig. 1 that decided them ([`BRANCHES`]).
    pub branches: [AtomicU64; 7],
}

/// The names of Fig. 1's branches, in [`LinkStats::branches`]' order.
pub const BRANCHES: [&str; 7] = [
    "large",
    "first-request",
    "initial-caches",
    "least-loaded-server",
    "initial-takes-over",
    "idle-takes-over",
    "all-overloaded",
];

fn branch_index(branch: Branch) -> usize {
    match branch {
        Branch::Large => 0,
        Branch::FirstRequest => 1,
        Branch::InitialCaches => 2,
        Branch::LeastLoadedServer => 3,
        Branch::InitialTakesOver => 4,
        Branch::IdleTakesOver => 5,
        Branch::AllOverloaded => 6,
    }
}

/// A snapshot of [`LinkCounters`] (`GET /stats`, `/metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkStats {
    /// Waits the receiver began with nothing to take (it went idle).
    pub idle_waits: u64,
    /// Waits that ended because a message (TCP, Base) or a doorbell (the
    /// ring versions) arrived.
    pub woken: u64,
    /// Ring versions: doorbells this node rang (a receiver it wrote to
    /// had published a new asleep generation).
    pub doorbells: u64,
    /// Zero: files written to a peer's ring straight from the registered
    /// cache (the others, `zero_copy_fallbacks`, went by a copy).
    pub files_from_slab: u64,
    /// Client requests by the line of Fig. 1 that decided them ([`BRANCHES`];
    /// lines 15-22, the load-balancing half, run only once a load passes T).
    #[serde(default)]
    pub branches: [u64; 7],
}

impl LinkCounters {
    pub fn snapshot(&self) -> LinkStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LinkStats {
            idle_waits: get(&self.idle_waits),
            woken: get(&self.woken),
            doorbells: get(&self.doorbells),
            files_from_slab: get(&self.files_from_slab),
            branches: std::array::from_fn(|i| get(&self.branches[i])),
        }
    }
}

/// Window flow control, both halves: the credits this node may spend per
/// receiver, and the messages it consumed per sender and has not yet
/// acknowledged.
#[derive(Debug)]
pub struct Window {
    window: u32,
    credits: Mutex<Vec<u32>>,
    changed: Condvar,
    consumed: Mutex<Vec<u32>>,
}

impl Window {
    pub fn new(nodes: usize, window: u32) -> Window {
        let window = window.max(2);
        Window {
            window,
            credits: Mutex::new(vec![window; nodes]),
            changed: Condvar::new(),
            consumed: Mutex::new(vec![0; nodes]),
        }
    }

    /// Takes one credit towards `to`, waiting up to `timeout` for one.
    pub fn acquire(&self, to: Member, timeout: Duration) -> Result<(), LinkError> {
        let start = instant_now();
        let mut credits = self.credits.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            match credits.get_mut(to.index()) {
                None => return Ok(()),
                Some(c) if *c > 0 => {
                    *c -= 1;
                    return Ok(());
                }
                Some(_) => {}
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(LinkError::NoCredit { to, waited_ms: waited.as_millis() as u64 });
            }
            credits = self.changed.wait_timeout(credits, timeout - waited).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Takes one credit towards `to` if one is left, without waiting.
    pub fn try_acquire(&self, to: Member) -> bool {
        let mut credits = self.credits.lock().unwrap_or_else(PoisonError::into_inner);
        match credits.get_mut(to.index()) {
            None => true,
            Some(c) if *c > 0 => {
                *c -= 1;
                true
            }
            Some(_) => false,
        }
    }

    /// A `Flow` message from `from` returned `credits`.
    pub fn grant(&self, from: Member, credits: u32) {
        let mut all = self.credits.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = all.get_mut(from.index()) {
            *c = c.saturating_add(credits).min(self.window);
        }
        self.changed.notify_all();
    }

    /// This node consumed a credit-bearing message from `from`; returns the
    /// credits to send back once half a window has accumulated.
    pub fn consumed(&self, from: Member) -> Option<u32> {
        let mut all = self.consumed.lock().unwrap_or_else(PoisonError::into_inner);
        let c = all.get_mut(from.index())?;
        *c += 1;
        if *c >= self.window / 2 {
            let credits = *c;
            *c = 0;
            Some(credits)
        } else {
            None
        }
    }

    /// Credits left towards `to` (for tests and stats).
    pub fn credits(&self, to: Member) -> u32 {
        self.credits.lock().unwrap_or_else(PoisonError::into_inner).get(to.index()).copied().unwrap_or(0)
    }

    /// `from` died or restarted: its credits and acknowledgements start over.
    pub fn reset(&self, peer: Member) {
        if let Some(c) = self.credits.lock().unwrap_or_else(PoisonError::into_inner).get_mut(peer.index()) {
            *c = self.window;
        }
        if let Some(c) = self.consumed.lock().unwrap_or_else(PoisonError::into_inner).get_mut(peer.index()) {
            *c = 0;
        }
        self.changed.notify_all();
    }
}

/// Whether a message spends a flow-control credit (all but `Flow` itself,
/// which would otherwise deadlock two full windows).
pub fn needs_credit(body: &Body) -> bool {
    !matches!(body, Body::Flow { .. })
}

/// The fabric identity of a cluster member (members are nodes `0..n`).
pub fn node_id(member: Member) -> NodeId {
    NodeId(u32::from(member.0))
}

/// A node's sending side.
pub struct Link {
    fabric: Arc<dyn Fabric>,
    kind: TransportKind,
    counters: Arc<Counters>,
    window: Option<Window>,
    rings: Option<Arc<crate::rings::Rings>>,
    credit_timeout: Duration,
    link_counters: Arc<LinkCounters>,
    /// Base: credits (`Flow`) go out from their own thread, so the receive
    /// thread never blocks on a peer whose inbox is full — while it would,
    /// it could not drain its own, and two such nodes wait on each other
    /// until the send timeout (seen: Base stalled at 96 connections).
    credits_out: Option<std::sync::mpsc::Sender<(Member, Vec<u8>)>>,
}

/// The credit sender thread: sends every queued `Flow` message, counted
/// when sent; ends when the link (the queue's sender) is dropped.
fn credit_sender(
    fabric: Arc<dyn Fabric>,
    counters: Arc<Counters>,
) -> std::io::Result<std::sync::mpsc::Sender<(Member, Vec<u8>)>> {
    let (tx, rx) = std::sync::mpsc::channel::<(Member, Vec<u8>)>();
    std::thread::Builder::new().name("press-credits".into()).spawn(move || {
        for (to, bytes) in rx {
            match fabric.send(node_id(to), Channel::PRESS, &bytes) {
                Ok(()) => counters.record(MsgType::Flow, bytes.len() as u64),
                Err(e) => tracing::debug!(%to, error = %e, "press credit send failed"),
            }
        }
    })?;
    Ok(tx)
}

impl Link {
    /// The link of `kind`; the remote-write versions register their rings here.
    pub fn new(
        fabric: Arc<dyn Fabric>,
        kind: TransportKind,
        me: Member,
        nodes: usize,
        window: u32,
        credit_timeout: Duration,
    ) -> Result<Link, LinkError> {
        let link_counters = Arc::new(LinkCounters::default());
        let rings = match kind {
            TransportKind::Rdma1c | TransportKind::Rdma | TransportKind::Zero => {
                Some(Arc::new(crate::rings::Rings::register(
                    fabric.clone(),
                    me,
                    nodes,
                    window,
                    kind != TransportKind::Rdma1c,
                    credit_timeout,
                    link_counters.clone(),
                )?))
            }
            _ => None,
        };
        let window = (kind == TransportKind::Base).then(|| Window::new(nodes, window));
        let counters: Arc<Counters> = Arc::default();
        let credits_out = match kind {
            TransportKind::Base => Some(credit_sender(fabric.clone(), counters.clone()).map_err(LinkError::Thread)?),
            _ => None,
        };
        Ok(Link { fabric, kind, counters, window, rings, credit_timeout, link_counters, credits_out })
    }

    /// Counts a client request decided by `branch` of Fig. 1 (kept with
    /// the link's counters so one snapshot carries every counter of issue 33).
    pub fn record_branch(&self, branch: Branch) {
        self.link_counters.branches[branch_index(branch)].fetch_add(1, Ordering::Relaxed);
    }

    /// The receiver's waits and wake-ups, doorbells rung, Zero's files sent
    /// from the registered cache.
    pub fn link_stats(&self) -> LinkStats {
        self.link_counters.snapshot()
    }

    /// The next message of `inbox` (TCP, Base), waiting up to `timeout`:
    /// taken at once if one is there, else through the fabric's wait
    /// (counted as an idle wait, and as a wake-up if a message ends it).
    pub fn receive(&self, inbox: &Inbox, timeout: Duration) -> Result<tierstack_fabric::Message, FabricError> {
        if let Some(message) = inbox.try_recv() {
            return Ok(message);
        }
        self.link_counters.idle_waits.fetch_add(1, Ordering::Relaxed);
        let message = inbox.recv_timeout(timeout)?;
        self.link_counters.woken.fetch_add(1, Ordering::Relaxed);
        Ok(message)
    }

    pub fn rings(&self) -> Option<&Arc<crate::rings::Rings>> {
        self.rings.as_ref()
    }

    pub fn kind(&self) -> TransportKind {
        self.kind
    }

    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    pub fn window(&self) -> Option<&Window> {
        self.window.as_ref()
    }

    pub fn fabric(&self) -> &Arc<dyn Fabric> {
        &self.fabric
    }

    /// Sends `message` to `to`, waiting (bounded) for a credit under Base
    /// and for room at the receiver. Blocks: call it from a thread that may
    /// block (`spawn_blocking`, the receive thread), never from an async task.
    pub fn send(&self, to: Member, message: &Message) -> Result<(), LinkError> {
        if let Some(rings) = &self.rings {
            return rings.send(to, message, &self.counters);
        }
        let bytes = encode(message)?;
        if let (Some(out), Body::Flow { .. }) = (&self.credits_out, &message.body) {
            // Queued: the credit thread sends it (and counts it).
            return out.send((to, bytes)).map_err(|_| LinkError::Fabric(FabricError::Closed));
        }
        if let Some(window) = &self.window {
            if needs_credit(&message.body) {
                window.acquire(to, self.credit_timeout)?;
            }
        }
        self.fabric.send(node_id(to), Channel::PRESS, &bytes)?;
        self.counters.record(message.body.msg_type(), bytes.len() as u64);
        Ok(())
    }

    /// Sends `message` to `to` only if nothing has to wait (a Base credit,
    /// room at the receiver, a post that completes elsewhere):
    /// `WouldBlock` (nothing sent, no credit spent) otherwise, and the
    /// caller hands the send to a thread that may block. For an async task.
    pub fn try_send(&self, to: Member, message: &Message) -> Result<TrySend, LinkError> {
        if let Some(rings) = &self.rings {
            return rings.try_send(to, message, None, &self.counters);
        }
        let bytes = encode(message)?;
        if let (Some(out), Body::Flow { .. }) = (&self.credits_out, &message.body) {
            out.send((to, bytes)).map_err(|_| LinkError::Fabric(FabricError::Closed))?;
            return Ok(TrySend::Sent);
        }
        let credited = match &self.window {
            Some(window) if needs_credit(&message.body) => {
                if !window.try_acquire(to) {
                    return Ok(TrySend::WouldBlock);
                }
                Some(window)
            }
            _ => None,
        };
        let sent = self.fabric.try_send(node_id(to), Channel::PRESS, &bytes);
        if !matches!(sent, Ok(TrySend::Sent)) {
            // Not sent: the credit goes back (a failed send's is lost with
            // the peer in `send` too, but `reset` restores it on restart).
            if let Some(window) = credited {
                window.grant(to, 1);
            }
        }
        if sent? == TrySend::Sent {
            self.counters.record(message.body.msg_type(), bytes.len() as u64);
            return Ok(TrySend::Sent);
        }
        Ok(TrySend::WouldBlock)
    }

    /// Counts a message type without sending (for tests of the counters).
    pub fn count(&self, kind: MsgType, bytes: u64) {
        self.counters.record(kind, bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_window_holds_the_sender_until_credits_return() {
        let w = Window::new(2, 4);
        for _ in 0..4 {
            w.acquire(Member(1), Duration::ZERO).unwrap();
        }
        let e = w.acquire(Member(1), Duration::from_millis(20)).unwrap_err();
        assert!(matches!(e, LinkError::NoCredit { to: Member(1), .. }));
        // The receiver's half: credits go back after half a window.
        let r = Window::new(2, 4);
        assert_eq!(r.consumed(Member(0)), None);
        assert_eq!(r.consumed(Member(0)), Some(2));
        w.grant(Member(1), 2);
        assert_eq!(w.credits(Member(1)), 2);
        // A waiter is woken by a grant from another thread.
        let w = Arc::new(w);
        w.acquire(Member(1), Duration::ZERO).unwrap();
        w.acquire(Member(1), Duration::ZERO).unwrap();
        let granter = {
            let w = w.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(10));
                w.grant(Member(1), 1);
            })
        };
        w.acquire(Member(1), Duration::from_secs(10)).unwrap();
        granter.join().unwrap();
        // Grants never exceed the window; reset restores it.
        w.grant(Member(1), 100);
        assert_eq!(w.credits(Member(1)), 4);
        w.acquire(Member(1), Duration::ZERO).unwrap();
        w.reset(Member(1));
        assert_eq!(w.credits(Member(1)), 4);
    }

    #[test]
    fn transports_parse_and_unbuilt_ones_say_so() {
        assert_eq!("tcp".parse::<TransportKind>().unwrap(), TransportKind::Tcp);
        assert_eq!("base".parse::<TransportKind>().unwrap().backend(), "shm");
        assert_eq!("zero".parse::<TransportKind>().unwrap().backend(), "shm");
        assert_eq!("rdma-1c".parse::<TransportKind>().unwrap().backend(), "shm");
        assert!("udp".parse::<TransportKind>().is_err());
        assert!(needs_credit(&Body::Forward { request: 1, path: "/".into() }));
        assert!(!needs_credit(&Body::Flow { credits: 1 }));
    }

    /// Base's credits never block the caller (the receive thread) on a
    /// peer whose inbox is full: queued, then sent once it drains.
    #[test]
    fn a_base_credit_is_sent_even_when_the_peers_inbox_is_full() {
        let dir = tempfile::tempdir().unwrap();
        let fabrics = tierstack_testkit::nodes::shm::nodes(dir.path(), 2, Duration::from_millis(200));
        let (f0, f1): (Arc<dyn Fabric>, Arc<dyn Fabric>) = (fabrics[0].clone(), fabrics[1].clone());
        let link1 = Link::new(f1.clone(), TransportKind::Base, Member(1), 2, 8, Duration::from_secs(1)).unwrap();
        // Fill node 0's inbox from node 1 until a send times out, with large
        // messages and then with the smallest, so not even a credit fits.
        let mut filled = 0;
        for size in [8192, 1] {
            while f1.send(NodeId(0), Channel::PRESS, &vec![0u8; size]).is_ok() {
                filled += 1;
                assert!(filled < 100_000, "the inbox never filled");
            }
        }
        // A blocking send would now time out; the credit is queued instead.
        link1.send(Member(0), &Message { load: 0, body: Body::Flow { credits: 4 } }).unwrap();
        let inbox = f0.inbox(Channel::PRESS);
        let mut flow = None;
        eventually("the credit arriving once node 0 drains its inbox", || {
            while let Some(m) = inbox.try_recv() {
                if let Ok(Message { body: Body::Flow { credits }, .. }) = tierstack_press::proto::decode(&m.payload) {
                    flow = Some(credits);
                }
            }
            flow.is_some()
        });
        assert_eq!(flow, Some(4));
        eventually("the credit counted", || link1.counters().snapshot().messages(MsgType::Flow) == 1);
    }

    /// Polls `check` until it holds (a deadline, not a timing assertion).
    fn eventually(what: &str, mut check: impl FnMut() -> bool) {
        let start = instant_now();
        while !check() {
            assert!(start.elapsed() < Duration::from_secs(30), "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A receiver of `kind` that went idle is woken by the next message,
    /// through its wait: the fabric's inbox wait for TCP and Base, the
    /// doorbell for the ring versions (one per message here, as the
    /// receiver published a new asleep generation before each).
    fn check_wake(kind: TransportKind) {
        use std::sync::atomic::AtomicBool;
        let dir = tempfile::tempdir().unwrap();
        let fabrics: Vec<Arc<dyn Fabric>> = match kind {
            TransportKind::Tcp => tierstack_testkit::nodes::tcp::cluster(0, 2, Duration::from_secs(5))
                .into_iter()
                .map(|f| f as Arc<dyn Fabric>)
                .collect(),
            _ => tierstack_testkit::nodes::shm::nodes(dir.path(), 2, Duration::from_secs(5))
                .into_iter()
                .map(|f| f as Arc<dyn Fabric>)
                .collect(),
        };
        let timeout = Duration::from_secs(5);
        let sender = Link::new(fabrics[0].clone(), kind, Member(0), 2, 8, timeout).unwrap();
        let receiver = Arc::new(Link::new(fabrics[1].clone(), kind, Member(1), 2, 8, timeout).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel::<Message>();
        let thread = {
            let (receiver, stop) = (receiver.clone(), stop.clone());
            std::thread::spawn(move || match receiver.rings() {
                Some(rings) => rings.clone().poll_loop(&stop, receiver.counters(), |_, arrival| {
                    if let crate::rings::Arrival::Message(m) = arrival {
                        let _ = tx.send(m);
                    }
                }),
                None => {
                    let inbox = receiver.fabric().inbox(Channel::PRESS);
                    while !stop.load(Ordering::Relaxed) {
                        match receiver.receive(inbox, Duration::from_millis(50)) {
                            Ok(m) => {
                                let _ = tx.send(tierstack_press::proto::decode(&m.payload).unwrap());
                            }
                            Err(FabricError::RecvTimeout { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            })
        };
        for round in 1..=3u32 {
            let before = receiver.link_stats();
            eventually("the receiver going idle", || receiver.link_stats().idle_waits > before.idle_waits);
            let message = Message { load: round, body: Body::Forward { request: u64::from(round), path: "/f".into() } };
            sender.send(Member(1), &message).unwrap();
            assert_eq!(rx.recv_timeout(Duration::from_secs(30)).unwrap(), message, "{kind:?} round {round}");
            let after = receiver.link_stats();
            assert!(after.woken > before.woken, "{kind:?}: the message ended an idle wait: {before:?} {after:?}");
            match kind {
                TransportKind::Tcp | TransportKind::Base => assert_eq!(sender.link_stats().doorbells, 0),
                _ => assert_eq!(
                    sender.link_stats().doorbells,
                    u64::from(round),
                    "{kind:?}: one doorbell per idle period"
                ),
            }
        }
        stop.store(true, Ordering::Relaxed);
        thread.join().unwrap();
    }

    /// A send that would wait (Base: no credit; the rings: no free entry)
    /// answers `WouldBlock` at once, spends and counts nothing, and goes
    /// through once the receiver returns room.
    fn check_try_send(kind: TransportKind) {
        use std::sync::atomic::AtomicBool;
        const WINDOW: u32 = 4;
        let dir = tempfile::tempdir().unwrap();
        let fabrics: Vec<Arc<dyn Fabric>> = tierstack_testkit::nodes::shm::nodes(dir.path(), 2, Duration::from_secs(5))
            .into_iter()
            .map(|f| f as Arc<dyn Fabric>)
            .collect();
        let timeout = Duration::from_secs(5);
        let sender = Link::new(fabrics[0].clone(), kind, Member(0), 2, WINDOW, timeout).unwrap();
        let receiver = Arc::new(Link::new(fabrics[1].clone(), kind, Member(1), 2, WINDOW, timeout).unwrap());
        let forward = |request: u64| Message { load: 0, body: Body::Forward { request, path: "/f".into() } };
        let mut sent = 0u64;
        let outcome = loop {
            match sender.try_send(Member(1), &forward(sent)).unwrap() {
                TrySend::Sent => sent += 1,
                TrySend::WouldBlock => break TrySend::WouldBlock,
            }
            assert!(sent <= 2 * u64::from(WINDOW), "{kind:?}: sent past the window without a receiver");
        };
        assert_eq!((outcome, sent), (TrySend::WouldBlock, u64::from(WINDOW)), "{kind:?}");
        assert_eq!(sender.counters().snapshot().messages(MsgType::Forward), sent, "{kind:?}: nothing counted unsent");
        if let Some(window) = sender.window() {
            assert_eq!(window.credits(Member(1)), 0, "no credit spent by the refused try");
        }
        // The receiver takes the messages (the rings return their credit
        // words as they go; Base's node would send a Flow: granted here).
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (receiver, stop) = (receiver.clone(), stop.clone());
            std::thread::spawn(move || match receiver.rings() {
                Some(rings) => rings.clone().poll_loop(&stop, receiver.counters(), |_, _| {}),
                None => {
                    while !stop.load(Ordering::Relaxed) {
                        let _ = receiver.fabric().inbox(Channel::PRESS).recv_timeout(Duration::from_millis(10));
                    }
                }
            })
        };
        if let Some(window) = sender.window() {
            window.grant(Member(1), WINDOW);
        }
        eventually("a try going through once the receiver made room", || {
            sender.try_send(Member(1), &forward(sent)).unwrap() == TrySend::Sent
        });
        stop.store(true, Ordering::Relaxed);
        thread.join().unwrap();
    }

    #[test]
    fn a_base_try_send_without_credit_would_block_and_spends_nothing() {
        check_try_send(TransportKind::Base);
    }

    #[test]
    fn a_ring_try_send_without_a_free_entry_would_block_and_spends_nothing() {
        check_try_send(TransportKind::Rdma1c);
    }

    #[test]
    fn an_idle_tcp_receiver_is_woken_by_the_next_message() {
        check_wake(TransportKind::Tcp);
    }

    #[test]
    fn an_idle_base_receiver_is_woken_by_the_next_message() {
        check_wake(TransportKind::Base);
    }

    #[test]
    fn an_idle_rdma_1c_receiver_is_woken_by_its_doorbell() {
        check_wake(TransportKind::Rdma1c);
    }

    #[test]
    fn an_idle_rdma_receiver_is_woken_by_its_doorbell() {
        check_wake(TransportKind::Rdma);
    }

    #[test]
    fn an_idle_zero_receiver_is_woken_by_its_doorbell() {
        check_wake(TransportKind::Zero);
    }
}
