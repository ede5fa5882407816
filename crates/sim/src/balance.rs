//! A discrete-event model of Fig. 8b (svc §5.2) for clusters larger than
//! this machine can host: front ends balancing closed-loop clients over N
//! back ends of W workers each, through the very policy the proxy runs
//! ([`tierstack_monitor::Balancer`]), fed by a model of one monitoring
//! scheme.
//!
//! What is modelled:
//! - **back ends**: W workers each; a request holds a worker for its cost
//!   (drawn from the caller's quantile function, the app server's
//!   "RUBiS-like" bounded Pareto in `bench monitor --figure 8b-sim`) and
//!   waits in a FIFO queue when every worker is busy. Its published
//!   counters are the app server's: running threads = busy workers,
//!   requests in flight = queued + in service, queue length = queued.
//! - **front ends**: F of them, each a [`Balancer`] that sees only its own
//!   dispatches; client `c` sends through front end `c mod F`. With F > 1
//!   the other front ends' requests are visible only through monitoring.
//! - **a second service** (optional, `background_clients`): the seed's data
//!   centre hosts two services on the same back ends. Its closed-loop
//!   clients go through a front end of their own that routes by hash of the
//!   document (load-oblivious), so the back ends' load is skewed in a way
//!   the balanced service's front ends see only through monitoring. Only
//!   the balanced service's requests are measured.
//! - **a scheme** ([`SchemeModel`]) is what it measurably costs and how
//!   old its value is: before each least-loaded choice the front end reads
//!   every back end **one after the other** (as the proxy's `route.rs`
//!   does), each read keeping the request waiting `read_ns`; a sync
//!   scheme's value is the back end's load when its read completes, an
//!   async scheme's the last value its sampler published (every
//!   `sample_period_ns`, from a seeded phase) before that moment. The
//!   inputs come from a measurement (`bench monitor`'s Fig. 8a), never
//!   from the result wanted.
//!
//! Not modelled: network latency, the front ends' CPU (a read delays the
//! request; it does not queue behind other reads), the back ends' compute
//! threads other than through the scheme inputs (they add the same number
//! of running threads to every back end, which changes no choice).
//!
//! Time is integer nanoseconds; events are ordered by (time, sequence
//! number); a run is a pure function of its configuration, trace, cost
//! function and seed.

use rand::Rng;
use serde::Serialize;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use tierstack_base::{seeded_rng, SeededRng};
use tierstack_monitor::{Balancer, BalancerConfig, Counters, Decision, Health, LoadRecord, Policy, Reading};
use tierstack_workload::{RequestStream, Trace};

/// Most back ends a run may model.
pub const BACKENDS_MAX: usize = 256;
/// Most workers per back end.
pub const WORKERS_MAX: usize = 4096;
/// Most front ends.
pub const FRONT_ENDS_MAX: usize = 256;
/// Most closed-loop clients.
pub const CLIENTS_MAX: usize = 1 << 20;
/// Longest read or sampling period a scheme may have: 10 s.
pub const SCHEME_NS_MAX: u64 = 10_000_000_000;

/// A configuration the model refuses.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BalanceSimError {
    #[error("balance model: {0}")]
    BadConfig(String),
    #[error("balance model: the trace has no documents")]
    EmptyTrace,
    #[error("balance model: the balancer found no back end (every one excluded)")]
    NoBackend,
}

/// One monitoring scheme as the model sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SchemeModel {
    pub name: String,
    /// How long reading one back end keeps the choice waiting, ns.
    pub read_ns: u64,
    /// 0 for a sync scheme (the value is read live); otherwise the back
    /// end's sampler publishes every this many ns and a read returns the
    /// last published value.
    pub sample_period_ns: u64,
}

/// One run of the model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BalanceSimConfig {
    pub backends: usize,
    /// Workers per back end.
    pub workers: usize,
    pub front_ends: usize,
    /// Closed-loop clients, one request outstanding each, no think time.
    pub clients: usize,
    /// Closed-loop clients of a second, hash-routed service on the same
    /// back ends (not measured).
    pub background_clients: usize,
    pub policy: Policy,
    /// What feeds least-loaded; `None`: only the front end's own requests
    /// in flight (nginx's `least_conn`). Only least-loaded reads.
    pub scheme: Option<SchemeModel>,
    /// Completions before the measurement starts.
    pub warmup_requests: u64,
    /// Completions measured.
    pub requests: u64,
    pub seed: u64,
}

impl BalanceSimConfig {
    pub fn validate(&self) -> Result<(), BalanceSimError> {
        let bad = |what: String| Err(BalanceSimError::BadConfig(what));
        if !(1..=BACKENDS_MAX).contains(&self.backends) {
            return bad(format!("{} back ends (1..={BACKENDS_MAX})", self.backends));
        }
        if !(1..=WORKERS_MAX).contains(&self.workers) {
            return bad(format!("{} workers per back end (1..={WORKERS_MAX})", self.workers));
        }
        if !(1..=FRONT_ENDS_MAX).contains(&self.front_ends) {
            return bad(format!("{} front ends (1..={FRONT_ENDS_MAX})", self.front_ends));
        }
        if !(1..=CLIENTS_MAX).contains(&self.clients) || self.background_clients > CLIENTS_MAX {
            return bad(format!(
                "{} clients and {} of the second service (1..={CLIENTS_MAX} each)",
                self.clients, self.background_clients
            ));
        }
        if self.requests == 0 {
            return bad("no requests to measure".into());
        }
        if let Some(scheme) = &self.scheme {
            if self.policy != Policy::LeastLoaded {
                return bad(format!("scheme {} feeds least-loaded only, not {}", scheme.name, self.policy.name()));
            }
            if scheme.read_ns > SCHEME_NS_MAX || scheme.sample_period_ns > SCHEME_NS_MAX {
                return bad(format!("scheme {}: read or period above {SCHEME_NS_MAX} ns", scheme.name));
            }
        }
        Ok(())
    }

    /// `hash`, `round-robin`, `least-loaded/<scheme>` or `least-conn`.
    pub fn label(&self) -> String {
        match (&self.scheme, self.policy) {
            (Some(scheme), _) => format!("least-loaded/{}", scheme.name),
            (None, Policy::LeastLoaded) => "least-conn".into(),
            (None, policy) => policy.name().into(),
        }
    }
}

/// What one run measured (after the warm-up).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BalanceSimReport {
    pub label: String,
    pub backends: usize,
    pub workers: usize,
    pub front_ends: usize,
    pub clients: usize,
    pub background_clients: usize,
    pub requests: u64,
    /// Simulated time of the measurement, ns.
    pub measured_ns: u64,
    pub throughput_rps: f64,
    /// Issue to answer, including the reads' wait.
    pub p50_us: f64,
    pub p99_us: f64,
    /// Mean wait for the reads before a choice, µs.
    pub read_wait_us: f64,
    /// Busy worker time over all workers' time (both services).
    pub utilization: f64,
    /// Both services' completions per second.
    pub total_throughput_rps: f64,
    /// The balanced service's completions per back end.
    pub served: Vec<u64>,
    /// The second service's completions per back end.
    pub served_background: Vec<u64>,
}

#[derive(Debug)]
enum Event {
    /// Client `client` sends its next request.
    Issue { client: usize },
    /// The reads are done: choose and dispatch.
    Decide { client: usize },
    /// Back end `backend` finished client `client`'s request.
    Done { client: usize, backend: usize },
}

struct Scheduled {
    at: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    /// Reversed, so the max-heap pops the earliest (time, sequence) first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Default)]
struct Backend {
    busy: usize,
    /// Clients whose requests wait for a worker.
    queue: VecDeque<usize>,
    /// (time, counters) after each change, oldest first; pruned to what a
    /// read can still ask for.
    history: VecDeque<(u64, Counters)>,
    /// Async sampler's first sample.
    phase_ns: u64,
    /// Integral of `busy` over time since `since_ns`.
    busy_area: u128,
    since_ns: u64,
    served: u64,
    served_background: u64,
}

impl Backend {
    fn counters(&self) -> Counters {
        let clamp = |n: usize| u16::try_from(n).unwrap_or(u16::MAX);
        Counters {
            running_threads: clamp(self.busy),
            in_flight_requests: clamp(self.busy + self.queue.len()),
            queue_len: clamp(self.queue.len()),
            ..Counters::default()
        }
    }

    /// The counters at time `t_ns` (at or before now).
    fn counters_at(&self, t_ns: u64) -> Counters {
        let after = self.history.partition_point(|(t, _)| *t <= t_ns);
        after.checked_sub(1).and_then(|i| self.history.get(i)).map_or_else(Counters::default, |(_, c)| *c)
    }

    /// Records a change at `now`, keeping one entry at or before `now - horizon`.
    fn changed(&mut self, now: u64, horizon_ns: u64, busy_before: usize) {
        self.busy_area += busy_before as u128 * u128::from(now - self.since_ns);
        self.since_ns = now;
        let counters = self.counters();
        self.history.push_back((now, counters));
        let keep_from = now.saturating_sub(horizon_ns);
        while self.history.len() >= 2 && self.history.get(1).is_some_and(|(t, _)| *t <= keep_from) {
            self.history.pop_front();
        }
    }
}

struct Client {
    stream: RequestStream,
    doc: usize,
    issued_ns: u64,
    front_end: usize,
}

struct Model<'a, F: Fn(f64) -> u64> {
    config: &'a BalanceSimConfig,
    trace: &'a Trace,
    cost_ns: F,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Scheduled>,
    backends: Vec<Backend>,
    front_ends: Vec<Balancer>,
    clients: Vec<Client>,
    rng: SeededRng,
    horizon_ns: u64,
    completed: u64,
    /// Set when the warm-up ends.
    measuring_since: Option<u64>,
    latencies_ns: Vec<u64>,
    read_wait_ns: u128,
    read_waits: u64,
}

/// Runs the model: `cost_ns(u)` is a request's service time for a uniform
/// draw `u` in [0, 1) (a quantile function).
pub fn run_balance<F: Fn(f64) -> u64>(
    config: &BalanceSimConfig,
    trace: &Trace,
    cost_ns: F,
) -> Result<BalanceSimReport, BalanceSimError> {
    config.validate()?;
    if trace.documents().is_empty() {
        return Err(BalanceSimError::EmptyTrace);
    }
    // The samplers' phases come from a generator of their own, so that
    // every configuration draws the same sequence of request costs.
    let mut phases = seeded_rng(config.seed ^ 0x7068_6173_6573);
    let (read_ns, period_ns) = config.scheme.as_ref().map_or((0, 0), |s| (s.read_ns, s.sample_period_ns));
    let backends = (0..config.backends)
        .map(|_| Backend {
            phase_ns: if period_ns > 0 { phases.gen_range(0..period_ns) } else { 0 },
            history: VecDeque::from([(0, Counters::default())]),
            ..Backend::default()
        })
        .collect();
    // Front end F (after the balanced service's) is the second service's.
    let front_ends = (0..=config.front_ends)
        .map(|f| {
            let seed = config.seed ^ (f as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let policy = if f < config.front_ends { config.policy } else { Policy::Hash };
            Balancer::new(config.backends, BalancerConfig { seed, ..BalancerConfig::new(policy) })
        })
        .collect();
    let background_seed = config.seed ^ 0x6261_636b;
    let clients = (0..config.clients)
        .map(|c| Client {
            stream: trace.stream(config.seed, c, config.clients),
            doc: 0,
            issued_ns: 0,
            front_end: c % config.front_ends,
        })
        .chain((0..config.background_clients).map(|c| Client {
            stream: trace.stream(background_seed, c, config.background_clients),
            doc: 0,
            issued_ns: 0,
            front_end: config.front_ends,
        }))
        .collect();
    let mut model = Model {
        config,
        trace,
        cost_ns,
        now: 0,
        seq: 0,
        queue: BinaryHeap::new(),
        backends,
        front_ends,
        clients,
        rng: seeded_rng(config.seed),
        // A read asks for the load at most one sampling period and one
        // round of reads ago.
        horizon_ns: period_ns + read_ns.saturating_mul(config.backends as u64) + 1,
        completed: 0,
        measuring_since: None,
        latencies_ns: Vec::new(),
        read_wait_ns: 0,
        read_waits: 0,
    };
    for client in 0..config.clients + config.background_clients {
        model.schedule(0, Event::Issue { client });
    }
    if config.warmup_requests == 0 {
        model.start_measuring();
    }
    while let Some(next) = model.queue.pop() {
        model.now = next.at;
        model.handle(next.event)?;
        if model.completed >= config.warmup_requests + config.requests {
            break;
        }
    }
    Ok(model.report())
}

impl<F: Fn(f64) -> u64> Model<'_, F> {
    fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.queue.push(Scheduled { at, seq: self.seq, event });
    }

    fn start_measuring(&mut self) {
        self.measuring_since = Some(self.now);
        for backend in &mut self.backends {
            backend.busy_area = 0;
            backend.since_ns = self.now;
            backend.served = 0;
            backend.served_background = 0;
        }
        self.read_wait_ns = 0;
        self.read_waits = 0;
    }

    /// Whether front end `front_end` reads the load before choosing.
    fn reads(&self, front_end: usize) -> bool {
        front_end < self.config.front_ends && self.config.policy == Policy::LeastLoaded && self.config.scheme.is_some()
    }

    fn handle(&mut self, event: Event) -> Result<(), BalanceSimError> {
        match event {
            Event::Issue { client } => {
                let Some(c) = self.clients.get_mut(client) else { return Ok(()) };
                c.doc = c.stream.next().unwrap_or(0);
                c.issued_ns = self.now;
                let front_end = c.front_end;
                let wait = match &self.config.scheme {
                    Some(scheme) if self.reads(front_end) => scheme.read_ns.saturating_mul(self.config.backends as u64),
                    _ => 0,
                };
                if front_end < self.config.front_ends {
                    self.read_wait_ns += u128::from(wait);
                    self.read_waits += 1;
                }
                if wait == 0 {
                    self.decide(client)?;
                } else {
                    self.schedule(self.now + wait, Event::Decide { client });
                }
            }
            Event::Decide { client } => self.decide(client)?,
            Event::Done { client, backend } => self.done(client, backend),
        }
        Ok(())
    }

    /// The reads a least-loaded front end made for the request issued at
    /// `issued`: back end `i`'s read completed at `issued + (i + 1) · read`.
    fn observe(&mut self, front_end: usize, issued: u64) {
        let Some(scheme) = self.config.scheme.as_ref().filter(|_| self.reads(front_end)) else { return };
        for (i, backend) in self.backends.iter().enumerate() {
            let read_at = issued + scheme.read_ns.saturating_mul(i as u64 + 1);
            let sampled_at = if scheme.sample_period_ns == 0 {
                Some(read_at)
            } else {
                // The sampler's last publication at or before the read.
                read_at
                    .checked_sub(backend.phase_ns)
                    .map(|since| backend.phase_ns + since / scheme.sample_period_ns * scheme.sample_period_ns)
            };
            let Some(sampled_at) = sampled_at else { continue };
            let record =
                LoadRecord { t_ns: sampled_at, counters: backend.counters_at(sampled_at), ..LoadRecord::default() };
            let reading = Reading { record, read_ns: read_at, health: Health::Fresh };
            if let Some(balancer) = self.front_ends.get_mut(front_end) {
                balancer.observe(i, &reading);
            }
        }
    }

    fn decide(&mut self, client: usize) -> Result<(), BalanceSimError> {
        let Some(c) = self.clients.get(client) else { return Ok(()) };
        let (front_end, issued, doc) = (c.front_end, c.issued_ns, c.doc);
        self.observe(front_end, issued);
        let key = self.trace.documents().get(doc).map_or("", |d| d.name.as_str());
        let Some(balancer) = self.front_ends.get_mut(front_end) else { return Ok(()) };
        let Decision::Route(index) = balancer.choose(key) else { return Err(BalanceSimError::NoBackend) };
        balancer.dispatched(index, self.now);
        let now = self.now;
        let horizon = self.horizon_ns;
        let Some(backend) = self.backends.get_mut(index) else { return Err(BalanceSimError::NoBackend) };
        let busy_before = backend.busy;
        if backend.busy < self.config.workers {
            backend.busy += 1;
            backend.changed(now, horizon, busy_before);
            let cost = (self.cost_ns)(self.rng.gen::<f64>());
            self.schedule(now + cost, Event::Done { client, backend: index });
        } else {
            backend.queue.push_back(client);
            backend.changed(now, horizon, busy_before);
        }
        Ok(())
    }

    fn done(&mut self, client: usize, index: usize) {
        let now = self.now;
        let horizon = self.horizon_ns;
        let mut next = None;
        let balanced = self.clients.get(client).is_some_and(|c| c.front_end < self.config.front_ends);
        if let Some(backend) = self.backends.get_mut(index) {
            let busy_before = backend.busy;
            if balanced {
                backend.served += 1;
            } else {
                backend.served_background += 1;
            }
            match backend.queue.pop_front() {
                // The freed worker takes the next queued request.
                Some(waiting) => next = Some(waiting),
                None => backend.busy = backend.busy.saturating_sub(1),
            }
            backend.changed(now, horizon, busy_before);
        }
        if let Some(waiting) = next {
            let cost = (self.cost_ns)(self.rng.gen::<f64>());
            self.schedule(now + cost, Event::Done { client: waiting, backend: index });
        }
        let Some(c) = self.clients.get(client) else { return };
        if let Some(balancer) = self.front_ends.get_mut(c.front_end) {
            balancer.completed(index, now);
        }
        // Only the balanced service's requests are measured.
        if c.front_end < self.config.front_ends {
            if self.measuring_since.is_some() {
                self.latencies_ns.push(now - c.issued_ns);
            }
            self.completed += 1;
            if self.measuring_since.is_none() && self.completed >= self.config.warmup_requests {
                self.start_measuring();
            }
        }
        self.schedule(now, Event::Issue { client });
    }

    fn report(mut self) -> BalanceSimReport {
        let since = self.measuring_since.unwrap_or(0);
        let measured_ns = self.now.saturating_sub(since);
        let now = self.now;
        for backend in &mut self.backends {
            backend.busy_area += backend.busy as u128 * u128::from(now - backend.since_ns);
        }
        let busy: u128 = self.backends.iter().map(|b| b.busy_area).sum();
        let capacity = (self.config.backends * self.config.workers) as f64 * measured_ns as f64;
        self.latencies_ns.sort_unstable();
        let requests = self.latencies_ns.len() as u64;
        BalanceSimReport {
            label: self.config.label(),
            backends: self.config.backends,
            workers: self.config.workers,
            front_ends: self.config.front_ends,
            clients: self.config.clients,
            background_clients: self.config.background_clients,
            requests,
            measured_ns,
            throughput_rps: requests as f64 * 1e9 / (measured_ns.max(1)) as f64,
            p50_us: tierstack_stats::percentile(&self.latencies_ns, 50.0) as f64 / 1000.0,
            p99_us: tierstack_stats::percentile(&self.latencies_ns, 99.0) as f64 / 1000.0,
            read_wait_us: self.read_wait_ns as f64 / self.read_waits.max(1) as f64 / 1000.0,
            utilization: busy as f64 / capacity.max(1.0),
            total_throughput_rps: self.backends.iter().map(|b| b.served + b.served_background).sum::<u64>() as f64
                * 1e9
                / (measured_ns.max(1)) as f64,
            served: self.backends.iter().map(|b| b.served).collect(),
            served_background: self.backends.iter().map(|b| b.served_background).collect(),
        }
    }
}
