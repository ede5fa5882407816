//! The discrete-event engine: clients, per-node CPU, NIC, disk and cache, and
//! the turning of a policy's actions into timed events.
//!
//! Time is integer nanoseconds from 0. Events are ordered by (time, sequence
//! number): the sequence number is the order of scheduling, so events at the
//! same time run in a deterministic order and a run is a pure function of its
//! inputs. Every resource is a FIFO whose completion time is known when a job
//! is submitted; jobs are submitted only at the current event's time, so each
//! FIFO sees arrivals in time order, as `DiskQueue` requires.

use crate::config::{Budget, ConfigError, Load, SimConfig};
use crate::costs::{transfer_ns, Costs};
use crate::policy::{
    Action, Actions, Copies, Delivery, DocId, Done, Outcome, Policy, Request, RequestId, Served, Via, View,
};
use crate::report::{MessageCount, NodeCounts, SimReport};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use tierstack_model::{Inserted, ReadOutcome, Storage, StorageConfig};
use tierstack_workload::arrival::{stream_of, ArrivalSchedule};
use tierstack_workload::{RequestStream, TargetChooser, Trace};

/// A run that could not complete.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("policy {policy}: {what}")]
    Policy { policy: &'static str, what: String },
    #[error("policy {policy} left {pending} of {issued} requests unanswered when no event was left")]
    Unfinished { policy: &'static str, pending: u64, issued: u64 },
}

/// Runs one simulation.
pub fn run<P: Policy>(config: &SimConfig, trace: &Trace, policy: P) -> Result<SimReport, SimError> {
    config.validate()?;
    if trace.documents().is_empty() {
        return Err(ConfigError::EmptyTrace.into());
    }
    let mut engine = Engine::new(config, trace, policy);
    engine.start();
    while let Some(next) = engine.queue.pop() {
        engine.now = next.at;
        engine.handle(next.event)?;
    }
    engine.finish(config, trace)
}

struct Scheduled<E> {
    at: u64,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Scheduled<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<E> Eq for Scheduled<E> {}
impl<E> PartialOrd for Scheduled<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Scheduled<E> {
    /// Reversed, so the max-heap pops the earliest (time, sequence) first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// One FIFO server: a NIC's transmitter.
#[derive(Default)]
struct Fifo {
    busy_until: u64,
    busy_ns: u64,
}

impl Fifo {
    fn submit(&mut self, now: u64, service: u64) -> u64 {
        let start = self.busy_until.max(now);
        self.busy_until = start.saturating_add(service);
        self.busy_ns = self.busy_ns.saturating_add(service);
        self.busy_until
    }
}

/// `k` FIFO servers sharing one queue: a node's CPU cores. A job takes the
/// core that frees first (the lowest-numbered on ties).
struct Cores {
    free_at: Vec<u64>,
    busy_ns: u64,
}

impl Cores {
    fn new(cores: u32) -> Self {
        Self { free_at: vec![0; cores.max(1) as usize], busy_ns: 0 }
    }

    fn submit(&mut self, now: u64, service: u64) -> u64 {
        let mut best = 0;
        for (i, &t) in self.free_at.iter().enumerate() {
            if t < self.free_at[best] {
                best = i;
            }
        }
        let end = self.free_at[best].max(now).saturating_add(service);
        self.free_at[best] = end;
        self.busy_ns = self.busy_ns.saturating_add(service);
        end
    }
}

struct RequestState {
    client: usize,
    initial: usize,
    doc: DocId,
    issued_ns: u64,
    new_connection: bool,
    replied: bool,
    forwarded: bool,
}

struct Client {
    stream: RequestStream,
    chooser: TargetChooser,
    /// For `Budget::PerClient`: requests still to issue.
    remaining: u64,
    /// Nodes this client holds a persistent connection to.
    connected: BTreeSet<usize>,
}

struct OpenLoop {
    schedule: ArrivalSchedule,
    total: u64,
    next: u64,
    streams: usize,
    /// Per node: idle persistent connections (the load client's pool).
    idle: Vec<u64>,
}

enum Event<M, T> {
    /// A closed-loop client issues its first request.
    Start { client: usize },
    /// The next open-loop arrival is due.
    Arrival,
    /// A request reached its initial node.
    AtNode { request: u64 },
    /// Its parse is done: the policy decides.
    Parsed { request: u64 },
    /// A `Serve` has the document in memory: a hit (at once, or when the
    /// read that brought the object in completes), or a miss's disk read.
    ServeReady { node: usize, request: u64, hit: bool, inserted: Option<Inserted<DocId>>, token: T },
    /// The reply body is copied; it goes to the NIC.
    ReplyCopied { node: usize, request: u64 },
    /// The reply reached the client.
    ReplyAtClient { request: u64 },
    /// A message's send costs are paid; it goes to the sender's NIC.
    SendPosted { message: InFlight<M> },
    /// A message reached the receiver; its receive costs follow.
    SendArrived { message: InFlight<M> },
    /// A message is ready for the policy.
    Delivered { delivery: Delivery<M> },
    /// A one-sided read's request is posted; the data crosses the target's NIC.
    ReadPosted { from: usize, target: usize, bytes: u64, token: T },
    /// A one-sided write is posted; the data crosses the initiator's NIC.
    WritePosted { from: usize, bytes: u64, token: T },
    /// An action completed.
    Done { done: Done<T> },
}

struct InFlight<M> {
    from: usize,
    to: usize,
    kind: &'static str,
    bytes: u64,
    via: Via,
    copies: Copies,
    sender_load: u32,
    payload: M,
}

type EventOf<P> = Event<<P as Policy>::Message, <P as Policy>::Token>;

struct Engine<'c, P: Policy> {
    costs: &'c Costs,
    policy: P,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Scheduled<EventOf<P>>>,
    stores: Vec<Storage<DocId>>,
    loads: Vec<u32>,
    cpus: Vec<Cores>,
    nics: Vec<Fifo>,
    counts: Vec<NodeCounts>,
    doc_bytes: Vec<u64>,
    new_connection_per_request: bool,
    requests: Vec<RequestState>,
    clients: Vec<Client>,
    total_budget: Option<u64>,
    open: Option<OpenLoop>,
    issued: u64,
    completed: u64,
    latencies: Vec<u64>,
    messages: BTreeMap<&'static str, MessageCount>,
    forwarded: u64,
    last_completion_ns: u64,
    actions: Actions<P>,
}

impl<'c, P: Policy> Engine<'c, P> {
    fn new(config: &'c SimConfig, trace: &Trace, policy: P) -> Self {
        let nodes = config.nodes;
        let clients_n = config.clients();
        let clients = (0..clients_n)
            .map(|w| Client {
                stream: trace.stream(config.seed, w, clients_n),
                chooser: TargetChooser::new(config.target_choice, config.client_nodes.unwrap_or(nodes), config.seed, w),
                remaining: match &config.load {
                    Load::Closed { budget: Budget::PerClient(counts), .. } => counts.get(w).copied().unwrap_or(0),
                    _ => 0,
                },
                connected: BTreeSet::new(),
            })
            .collect();
        let (total_budget, open) = match &config.load {
            Load::Closed { budget: Budget::Total(total), .. } => (Some(*total), None),
            Load::Closed { budget: Budget::PerClient(_), .. } => (None, None),
            Load::Open { rate_per_s, requests, streams, arrivals } => (
                None,
                Some(OpenLoop {
                    schedule: ArrivalSchedule::new(*arrivals, *rate_per_s, config.seed),
                    total: *requests,
                    next: 0,
                    streams: *streams,
                    idle: vec![0; nodes],
                }),
            ),
        };
        let expected = match &config.load {
            Load::Closed { budget: Budget::Total(t), .. } => *t,
            Load::Closed { budget: Budget::PerClient(c), .. } => c.iter().sum(),
            Load::Open { requests, .. } => *requests,
        };
        Self {
            costs: &config.costs,
            policy,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            stores: (0..nodes)
                .map(|_| {
                    Storage::new(StorageConfig {
                        cache_bytes: config.cache_bytes,
                        cache_max_object_bytes: config.cache_max_object_bytes,
                        disk: Some(config.disk),
                    })
                })
                .collect(),
            loads: vec![0; nodes],
            cpus: (0..nodes).map(|_| Cores::new(config.costs.cpu.cores)).collect(),
            nics: (0..nodes).map(|_| Fifo::default()).collect(),
            counts: vec![NodeCounts::default(); nodes],
            doc_bytes: trace.documents().iter().map(|d| d.size_bytes).collect(),
            new_connection_per_request: config.new_connection_per_request,
            requests: Vec::with_capacity(usize::try_from(expected).unwrap_or(0).min(1 << 24)),
            clients,
            total_budget,
            open,
            issued: 0,
            completed: 0,
            latencies: Vec::with_capacity(usize::try_from(expected).unwrap_or(0).min(1 << 24)),
            messages: BTreeMap::new(),
            forwarded: 0,
            last_completion_ns: 0,
            actions: Vec::new(),
        }
    }

    fn schedule(&mut self, at: u64, event: EventOf<P>) {
        self.seq += 1;
        self.queue.push(Scheduled { at, seq: self.seq, event });
    }

    fn start(&mut self) {
        if let Some(open) = self.open.as_mut() {
            let first = open.schedule.next().unwrap_or(0);
            self.schedule(first, Event::Arrival);
        } else {
            for client in 0..self.clients.len() {
                self.schedule(0, Event::Start { client });
            }
        }
    }

    fn violation(&self, what: String) -> SimError {
        SimError::Policy { policy: self.policy.name(), what }
    }

    fn node_ok(&self, node: usize, action: &str) -> Result<(), SimError> {
        if node >= self.stores.len() {
            return Err(self.violation(format!("{action} names node {node} of {}", self.stores.len())));
        }
        Ok(())
    }

    fn request_ok(&self, request: RequestId, action: &str) -> Result<usize, SimError> {
        let index = usize::try_from(request.0).unwrap_or(usize::MAX);
        match self.requests.get(index) {
            Some(state) if !state.replied => Ok(index),
            Some(_) => Err(self.violation(format!("{action} for request {} after its reply", request.0))),
            None => Err(self.violation(format!("{action} for unknown request {}", request.0))),
        }
    }

    fn request_view(&self, index: usize) -> Request {
        let state = &self.requests[index];
        Request {
            id: RequestId(index as u64),
            initial: state.initial,
            doc: state.doc,
            bytes: self.doc_bytes[state.doc],
        }
    }

    /// A closed-loop client issues its next request, if its budget allows.
    fn issue_closed(&mut self, client: usize) {
        if let Some(total) = self.total_budget {
            if self.issued >= total {
                return;
            }
        } else {
            let c = &mut self.clients[client];
            if c.remaining == 0 {
                return;
            }
            c.remaining -= 1;
        }
        self.issue(client);
    }

    /// Client `client` sends a request now.
    fn issue(&mut self, client: usize) {
        let c = &mut self.clients[client];
        // Non-empty traces never end a stream (checked in `run`).
        let doc = c.stream.next().unwrap_or(0);
        let node = c.chooser.next().unwrap_or(0);
        // Persistent connections: a closed-loop client keeps one per node it
        // has used; the open loop takes an idle one from the node's pool.
        let new_connection = self.new_connection_per_request
            || match self.open.as_mut() {
                None => c.connected.insert(node),
                Some(open) => match open.idle.get_mut(node) {
                    Some(idle) if *idle > 0 => {
                        *idle -= 1;
                        false
                    }
                    _ => true,
                },
            };
        let net = &self.costs.client_network;
        let connect = if new_connection { net.connect_ns } else { 0 };
        let arrive = self.now + connect + net.latency_ns + transfer_ns(net.request_bytes, net.bandwidth_bytes_per_s);
        let id = self.requests.len() as u64;
        self.requests.push(RequestState {
            client,
            initial: node,
            doc,
            issued_ns: self.now,
            new_connection,
            replied: false,
            forwarded: false,
        });
        self.issued += 1;
        if new_connection {
            self.counts[node].connections += 1;
        }
        self.schedule(arrive, Event::AtNode { request: id });
    }

    fn handle(&mut self, event: EventOf<P>) -> Result<(), SimError> {
        match event {
            Event::Start { client } => self.issue_closed(client),
            Event::Arrival => self.arrival(),
            Event::AtNode { request } => {
                let state = &self.requests[request as usize];
                let node = state.initial;
                let setup = if state.new_connection { self.costs.cpu.connection_setup_ns } else { 0 };
                self.loads[node] += 1;
                self.counts[node].requests += 1;
                let end = self.cpus[node].submit(self.now, self.costs.cpu.request_ns + setup);
                self.schedule(end, Event::Parsed { request });
            }
            Event::Parsed { request } => {
                let req = self.request_view(request as usize);
                self.call(|policy, view, out| policy.on_request(view, req.initial, req, out))?;
            }
            Event::ServeReady { node, request, hit, inserted, token } => {
                self.served(node, request, hit, inserted, token)?;
            }
            Event::ReplyCopied { node, request } => {
                let state = &self.requests[request as usize];
                let (initial, bytes) = (state.initial, self.doc_bytes[state.doc]);
                self.loads[initial] = self.loads[initial].saturating_sub(1);
                let net = &self.costs.client_network;
                let wire = transfer_ns(net.reply_header_bytes + bytes, net.bandwidth_bytes_per_s);
                let end = self.nics[node].submit(self.now, wire);
                self.schedule(end + net.latency_ns, Event::ReplyAtClient { request });
            }
            Event::ReplyAtClient { request } => {
                let state = &self.requests[request as usize];
                let client = state.client;
                self.latencies.push(self.now - state.issued_ns);
                self.completed += 1;
                self.last_completion_ns = self.now;
                match self.open.as_mut() {
                    None => self.issue_closed(client),
                    Some(open) if !self.new_connection_per_request => {
                        if let Some(idle) = open.idle.get_mut(state.initial) {
                            *idle += 1;
                        }
                    }
                    Some(_) => {}
                }
            }
            Event::SendPosted { message } => {
                let transport = match message.via {
                    Via::Message => self.costs.messages(),
                    Via::RemoteWrite => self.costs.remote_write(),
                };
                let end = self.nics[message.from]
                    .submit(self.now, transfer_ns(message.bytes, transport.bandwidth_bytes_per_s));
                let arrive = end + transport.wire_ns(message.via == Via::Message);
                self.schedule(arrive, Event::SendArrived { message });
            }
            Event::SendArrived { message } => {
                let cost = match message.via {
                    Via::Message => {
                        let t = self.costs.messages();
                        t.receiver_cpu_ns
                            + u64::from(t.receiver_copies + message.copies.receiver) * self.costs.copy_ns(message.bytes)
                    }
                    Via::RemoteWrite => {
                        self.costs.cpu.poll_ns + u64::from(message.copies.receiver) * self.costs.copy_ns(message.bytes)
                    }
                };
                let end = self.cpus[message.to].submit(self.now, cost);
                let delivery = Delivery {
                    from: message.from,
                    to: message.to,
                    kind: message.kind,
                    bytes: message.bytes,
                    sender_load: message.sender_load,
                    payload: message.payload,
                };
                self.schedule(end, Event::Delivered { delivery });
            }
            Event::Delivered { delivery } => {
                self.call(|policy, view, out| policy.on_message(view, delivery, out))?;
            }
            Event::ReadPosted { from, target, bytes, token } => {
                let t = self.costs.remote_read();
                let end = self.nics[target].submit(self.now, transfer_ns(bytes, t.bandwidth_bytes_per_s));
                let done = Done { node: from, outcome: Outcome::Completed, token };
                self.schedule(end + t.wire_ns(false), Event::Done { done });
            }
            Event::WritePosted { from, bytes, token } => {
                let t = self.costs.remote_write();
                let end = self.nics[from].submit(self.now, transfer_ns(bytes, t.bandwidth_bytes_per_s));
                let done = Done { node: from, outcome: Outcome::Completed, token };
                self.schedule(end + t.wire_ns(false), Event::Done { done });
            }
            Event::Done { done } => {
                self.call(|policy, view, out| policy.on_done(view, done, out))?;
            }
        }
        Ok(())
    }

    fn arrival(&mut self) {
        let Some(open) = self.open.as_mut() else { return };
        let stream = stream_of(open.next, open.streams);
        open.next += 1;
        let next_at = if open.next < open.total { open.schedule.next() } else { None };
        self.issue(stream);
        if let Some(at) = next_at {
            self.schedule(at.max(self.now), Event::Arrival);
        }
    }

    fn served(
        &mut self,
        node: usize,
        request: u64,
        hit: bool,
        inserted: Option<Inserted<DocId>>,
        token: P::Token,
    ) -> Result<(), SimError> {
        let req = self.request_view(request as usize);
        if node != req.initial {
            self.loads[node] = self.loads[node].saturating_sub(1);
        }
        let served = Served { node, request: req, hit, inserted, token };
        self.call(|policy, view, out| policy.on_served(view, served, out))
    }

    /// Calls the policy with a view of now, then applies what it asked for.
    fn call<F>(&mut self, f: F) -> Result<(), SimError>
    where
        F: FnOnce(&mut P, &View<'_>, &mut Actions<P>),
    {
        let mut out = std::mem::take(&mut self.actions);
        {
            let view =
                View { now_ns: self.now, stores: &self.stores, loads: &self.loads, document_bytes: &self.doc_bytes };
            f(&mut self.policy, &view, &mut out);
        }
        let mut result = Ok(());
        for action in out.drain(..) {
            if result.is_ok() {
                result = self.apply(action);
            }
        }
        self.actions = out;
        result
    }

    fn count_message(&mut self, from: usize, kind: &'static str, bytes: u64) {
        let entry = self.messages.entry(kind).or_default();
        entry.messages += 1;
        entry.bytes += bytes;
        self.counts[from].messages_sent += 1;
        self.counts[from].message_bytes_sent += bytes;
    }

    fn apply(&mut self, action: Action<P::Message, P::Token>) -> Result<(), SimError> {
        match action {
            Action::Serve { node, request, caching, token } => {
                self.node_ok(node, "serve")?;
                let index = self.request_ok(request, "serve")?;
                let req = self.request_view(index);
                let counts = &mut self.counts[node];
                counts.served += 1;
                if node != req.initial {
                    counts.served_for_others += 1;
                    self.loads[node] += 1;
                    let state = &mut self.requests[index];
                    if !state.forwarded {
                        state.forwarded = true;
                        self.forwarded += 1;
                    }
                }
                // Decided now, by `tierstack origin`'s own storage code;
                // its hits, misses, disk reads and evictions are the node's.
                let read = self.stores[node].read(self.now, &req.doc, req.bytes, caching);
                let ready_ns = read.ready_ns();
                let (hit, inserted) = match read {
                    ReadOutcome::Hit { .. } => (true, None),
                    ReadOutcome::Miss { inserted, .. } => (false, inserted),
                };
                self.schedule(ready_ns, Event::ServeReady { node, request: request.0, hit, inserted, token });
            }
            Action::Reply { node, request } => {
                self.node_ok(node, "reply")?;
                let index = self.request_ok(request, "reply")?;
                let bytes = self.doc_bytes[self.requests[index].doc];
                self.requests[index].replied = true;
                let counts = &mut self.counts[node];
                counts.replies += 1;
                counts.reply_bytes += bytes;
                let end = self.cpus[node].submit(self.now, self.costs.copy_ns(bytes));
                self.schedule(end, Event::ReplyCopied { node, request: request.0 });
            }
            Action::Send { from, to, kind, bytes, via, copies, payload } => {
                self.node_ok(from, "send")?;
                self.node_ok(to, "send")?;
                self.count_message(from, kind, bytes);
                let cost = match via {
                    Via::Message => {
                        let t = self.costs.messages();
                        t.sender_cpu_ns + u64::from(t.sender_copies + copies.sender) * self.costs.copy_ns(bytes)
                    }
                    Via::RemoteWrite => {
                        let t = self.costs.remote_write();
                        t.sender_cpu_ns + u64::from(t.sender_copies + copies.sender) * self.costs.copy_ns(bytes)
                    }
                };
                let end = self.cpus[from].submit(self.now, cost);
                let message = InFlight { from, to, kind, bytes, via, copies, sender_load: self.loads[from], payload };
                self.schedule(end, Event::SendPosted { message });
            }
            Action::RemoteRead { from, target, kind, bytes, token } => {
                self.node_ok(from, "remote read")?;
                self.node_ok(target, "remote read")?;
                self.count_message(from, kind, bytes);
                let t = self.costs.remote_read();
                let cost = t.sender_cpu_ns + u64::from(t.sender_copies) * self.costs.copy_ns(bytes);
                let end = self.cpus[from].submit(self.now, cost);
                self.schedule(end, Event::ReadPosted { from, target, bytes, token });
            }
            Action::RemoteWrite { from, target, kind, bytes, token } => {
                self.node_ok(from, "remote write")?;
                self.node_ok(target, "remote write")?;
                self.count_message(from, kind, bytes);
                let t = self.costs.remote_write();
                let cost = t.sender_cpu_ns + u64::from(t.sender_copies) * self.costs.copy_ns(bytes);
                let end = self.cpus[from].submit(self.now, cost);
                self.schedule(end, Event::WritePosted { from, bytes, token });
            }
            Action::DiskRead { node, bytes, token } => {
                self.node_ok(node, "disk read")?;
                let end = self.stores[node].disk_read(self.now, bytes);
                self.schedule(end, Event::Done { done: Done { node, outcome: Outcome::Completed, token } });
            }
            Action::Compute { node, ns, token } => {
                self.node_ok(node, "compute")?;
                let end = self.cpus[node].submit(self.now, ns);
                self.schedule(end, Event::Done { done: Done { node, outcome: Outcome::Completed, token } });
            }
            Action::CacheInsert { node, doc, token } => {
                self.node_ok(node, "cache insert")?;
                let bytes = self
                    .doc_bytes
                    .get(doc)
                    .copied()
                    .ok_or_else(|| self.violation(format!("unknown document {doc}")))?;
                let inserted = self.stores[node].insert_now(doc, bytes);
                self.schedule(
                    self.now,
                    Event::Done { done: Done { node, outcome: Outcome::Inserted(inserted), token } },
                );
            }
            Action::CacheTouch { node, doc, token } => {
                self.node_ok(node, "cache touch")?;
                let hit = self.stores[node].touch(&doc);
                self.schedule(self.now, Event::Done { done: Done { node, outcome: Outcome::Touched { hit }, token } });
            }
            Action::CacheRemove { node, doc } => {
                self.node_ok(node, "cache remove")?;
                self.stores[node].remove(&doc);
            }
        }
        Ok(())
    }

    fn finish(mut self, config: &SimConfig, trace: &Trace) -> Result<SimReport, SimError> {
        if self.completed != self.issued {
            return Err(SimError::Unfinished {
                policy: self.policy.name(),
                pending: self.issued - self.completed,
                issued: self.issued,
            });
        }
        for (node, counts) in self.counts.iter_mut().enumerate() {
            counts.cpu_busy_ns = self.cpus[node].busy_ns;
            let storage = self.stores[node].counts();
            counts.hits = storage.cache_hits;
            counts.misses = storage.cache_misses;
            counts.evictions = storage.evictions;
            counts.disk_reads = storage.disk_reads;
            counts.disk_bytes = storage.disk_bytes;
            counts.disk_busy_ns = storage.disk_busy_ns;
            counts.nic_busy_ns = self.nics[node].busy_ns;
        }
        let messages = self.messages.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        Ok(SimReport::build(crate::report::Outcome {
            config,
            trace,
            policy: self.policy.name(),
            policy_counters: self.policy.counters(),
            issued: self.issued,
            completed: self.completed,
            makespan_ns: self.last_completion_ns,
            latencies: self.latencies,
            forwarded: self.forwarded,
            messages,
            per_node: self.counts,
        }))
    }
}
