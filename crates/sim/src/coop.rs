//! The cooperative caching schemes as a simulator policy (coop seed,
//! seed-notes a.4 and a.6 #6).
//!
//! Nodes `0..proxies` are the proxies (clients send only to them:
//! `SimConfig::client_nodes`), then `backends` web servers, which serve
//! misses from their storage (the engine's `Serve`: with a 0-byte cache,
//! every miss is a disk read, the calibrated miss cost) and, for MTACC and
//! HYBCC, run the passive modules. The proxies' caches are
//! [`tierstack_coop::Model`]'s (page-based pools, the schemes' placement),
//! not the engine's storage: a request is decided at its arrival by the
//! model, exactly as `tierstack_coop` decides it, and the message log of
//! that decision becomes actions:
//! - a local hit replies at once;
//! - a remote hit waits for the one-sided read of the entity from its
//!   holder (the data crosses the holder's NIC; its CPU never runs), then
//!   replies; groupcache instead sends GET and gets the bytes in a two-sided
//!   reply;
//! - a miss sends GET to the document's web server (hash of the document),
//!   whose reply carries the body back, then replies (a groupcache miss at
//!   another owner goes through the owner);
//! - every other message of the decision (metadata updates, STOREs and
//!   their reads, swaps, transfers) is issued at the same time and costs
//!   what its transport costs, without holding the reply.
//!
//! Bookkeeping (seed Fig. 7): a cooperative scheme first searches its
//! replica: `lookup_ns` per node whose page table it searches (the proxies
//! for BCC and small HYBCC entities; every node that may hold the entity,
//! doubled for the duplicate search, for CCWR, MTACC and large HYBCC
//! entities). The constant is a parameter; the seed gives only its share:
//! "about 5-10% of the total request processing time for a file of 8
//! Kbytes" for CCWR.
//!
//! Announces (issue 34): the fabric service sends each change of a node's
//! contents (a copy added or dropped by a primitive) to every other member,
//! the soft state's broadcast. With `announce_bytes` set, every decision
//! that changed a node's contents (`Model::changes`) sends one announce of
//! that size from it to each other member (the proxies, and the passive
//! nodes where the scheme uses them): off the reply's path, but charged at
//! both ends like any message. AC and groupcache announce nothing.
//!
//! Simplification: decisions take effect at the request's arrival (the
//! model is one consistent state), so a remote hit never finds its copy
//! gone during the read, and two requests never race for one entity.

use crate::policy::{Action, Actions, Copies, Delivery, Done, Policy, Request, RequestId, Served, Via, View};
use std::collections::{BTreeMap, HashMap};
use tierstack_coop::key::mix;
use tierstack_coop::model::Served as Decided;
use tierstack_coop::{Model, ModelConfig, MsgKind, Scheme};

/// Replica search cost per page table, by default: picked so that CCWR's
/// bookkeeping on 2 proxies (2 tables, doubled for the duplicate search:
/// 10 µs) is 5 % of the seeds' 200 µs request, the low end of the seed's
/// "about 5-10%" (Fig. 7, §4.2.2).
pub const LOOKUP_NS_DEFAULT: u64 = 2_500;

/// Bytes of a GET from a proxy to a web server or a groupcache owner.
const GET_BYTES: u64 = 200;

/// The policy's configuration.
#[derive(Clone, Copy, Debug)]
pub struct CoopSim {
    pub scheme: Scheme,
    pub proxies: usize,
    pub backends: usize,
    /// Cache bytes per node (proxies, and passive back ends where used).
    pub cache_bytes: u64,
    /// Replica search cost per page table searched (the seed's design:
    /// the search grows with the node count).
    pub lookup_ns: u64,
    /// Replica search cost per lookup, whatever the node count (tierstack's
    /// replica is one hash map: `bench coop --figure 7`'s local hit).
    pub lookup_fixed_ns: u64,
    /// Bytes of one announce (the service's soft-state broadcast); 0: not
    /// charged (the seed's accounting, seed-notes a.3 rule 3).
    pub announce_bytes: u64,
    /// Proxy CPU per miss beyond its messages: the proxy's own cost of
    /// fetching from another tier (a new HTTP request and its response, as
    /// Apache's proxy module pays it). 0: the messages' costs only.
    pub miss_cpu_ns: u64,
}

/// The cooperative caching policy (see the module docs).
pub struct Coop {
    config: CoopSim,
    model: Model,
    requests: HashMap<RequestId, Request>,
}

/// What a message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoopMessage {
    /// GET to a web server on behalf of `request`; the body goes to `to`.
    Get { request: RequestId, to: usize },
    /// The body arrives at a proxy; it replies if it is the request's
    /// initial node, else forwards it there (groupcache owner).
    Body { request: RequestId },
    /// Groupcache: GET to the owner, which has the entity.
    OwnerGet { request: RequestId },
    /// Groupcache: GET to the owner, which misses and asks a web server.
    OwnerMiss { request: RequestId },
    /// A message off the reply's path (metadata, STORE, ack, transfer).
    Background,
}

/// What a completion carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoopToken {
    /// The replica search of `request` is done: decide.
    Lookup(RequestId),
    /// The remote read of `request`'s entity is done: reply.
    Read(RequestId),
    /// The proxy's miss work is done: send the GET to `to`.
    MissWork {
        request: RequestId,
        to: usize,
        payload: CoopMessage,
    },
    /// The web server has the body of `request` in memory; send it to `to`.
    Origin {
        request: RequestId,
        to: usize,
    },
    Background,
}

impl Coop {
    pub fn new(config: CoopSim) -> Result<Self, tierstack_coop::CoopError> {
        let pages = u32::try_from(config.cache_bytes / tierstack_coop::PAGE_BYTES).unwrap_or(u32::MAX);
        let model = Model::new(ModelConfig {
            scheme: config.scheme,
            active: config.proxies,
            passive: config.backends,
            pages_per_node: pages,
        })?;
        Ok(Self { config, model, requests: HashMap::new() })
    }

    /// The cluster model (for its tally and stats after a run).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Warms the caches up before a run: `requests` requests of `trace`'s
    /// stream `seed` (not the run's streams), dealt round-robin over the
    /// proxies, decided by the model with no time passing; then the counts
    /// are reset, so the run measures the steady state (the seed reports
    /// steady-state throughput).
    pub fn warm_up(&mut self, trace: &tierstack_workload::Trace, seed: u64, requests: usize) {
        let docs = trace.documents();
        for (i, doc) in trace.stream(seed, 0, 1).take(requests).enumerate() {
            let bytes = docs.get(doc).map_or(0, |d| d.size_bytes);
            let _ = self.model.request(i % self.config.proxies.max(1), doc as u64, bytes);
        }
        self.model.reset_counts();
    }

    fn backend(&self, doc: usize) -> usize {
        self.config.proxies + (mix(doc as u64 ^ 0xbac) % self.config.backends.max(1) as u64) as usize
    }

    fn lookup_cost(&self, bytes: u64) -> u64 {
        let (mode, passive) = self.config.scheme.mode_for(bytes);
        let tables = if passive { self.config.proxies + self.config.backends } else { self.config.proxies } as u64;
        let fixed = self.config.lookup_fixed_ns;
        match mode {
            tierstack_coop::Mode::Local => 0,
            tierstack_coop::Mode::Redundant => fixed + self.config.lookup_ns * tables,
            tierstack_coop::Mode::NoRedundancy => fixed + 2 * self.config.lookup_ns * tables,
        }
    }

    /// The nodes announces go to: the service's members.
    fn members(&self) -> usize {
        self.config.proxies + if self.config.scheme.uses_passive() { self.config.backends } else { 0 }
    }

    /// One announce from every node whose contents `decide` changed to
    /// every other member (see the module docs).
    fn announce(&self, before: &[u64], out: &mut Actions<Self>) {
        if self.config.announce_bytes == 0 || matches!(self.config.scheme, Scheme::Ac | Scheme::Groupcache) {
            return;
        }
        let members = self.members();
        for (from, &was) in before.iter().enumerate().take(members) {
            if self.model.changes(from) == was {
                continue;
            }
            for to in (0..members).filter(|&to| to != from) {
                out.push(Action::Send {
                    from,
                    to,
                    kind: "announce",
                    bytes: self.config.announce_bytes,
                    via: Via::Message,
                    copies: Copies::default(),
                    payload: CoopMessage::Background,
                });
            }
        }
    }

    fn decide(&mut self, node: usize, request: Request, out: &mut Actions<Self>) {
        let before: Vec<u64> = (0..self.model.node_count()).map(|n| self.model.changes(n)).collect();
        let Ok(outcome) = self.model.request(node, request.doc as u64, request.bytes) else {
            // The model refuses only a request at a non-proxy, which the
            // engine never sends here (client_nodes); answer it from disk.
            out.push(Action::Serve {
                node,
                request: request.id,
                caching: crate::Caching::Bypass,
                token: CoopToken::Background,
            });
            return;
        };
        self.announce(&before, out);
        let mut main_read = None;
        if let Decided::RemoteHit { holder } = outcome.served {
            if self.config.scheme != Scheme::Groupcache {
                main_read =
                    outcome.steps.iter().position(|s| s.kind == MsgKind::DataRead && s.from == node && s.to == holder);
            }
        }
        for (i, step) in outcome.steps.iter().enumerate() {
            // Groupcache's GET and reply are the reply path itself.
            if matches!(step.kind, MsgKind::GroupGet | MsgKind::GroupReply) {
                continue;
            }
            let kind = step.kind.name();
            if step.kind.is_one_sided() {
                let token = if Some(i) == main_read { CoopToken::Read(request.id) } else { CoopToken::Background };
                out.push(Action::RemoteRead { from: step.from, target: step.to, kind, bytes: step.bytes, token });
            } else {
                out.push(Action::Send {
                    from: step.from,
                    to: step.to,
                    kind,
                    bytes: step.bytes,
                    via: Via::Message,
                    copies: Copies::default(),
                    payload: CoopMessage::Background,
                });
            }
        }
        match outcome.served {
            Decided::LocalHit => out.push(Action::Reply { node, request: request.id }),
            Decided::RemoteHit { holder } if self.config.scheme == Scheme::Groupcache => {
                out.push(get(node, holder, CoopMessage::OwnerGet { request: request.id }))
            }
            Decided::RemoteHit { .. } if main_read.is_some() => {}
            Decided::RemoteHit { .. } => out.push(Action::Reply { node, request: request.id }),
            Decided::Miss { by } if by == node => {
                let backend = self.backend(request.doc);
                let payload = CoopMessage::Get { request: request.id, to: node };
                if self.config.miss_cpu_ns == 0 {
                    out.push(get(node, backend, payload));
                } else {
                    let token = CoopToken::MissWork { request: request.id, to: backend, payload };
                    out.push(Action::Compute { node, ns: self.config.miss_cpu_ns, token });
                }
            }
            Decided::Miss { by } => out.push(get(node, by, CoopMessage::OwnerMiss { request: request.id })),
        }
    }
}

fn get(from: usize, to: usize, payload: CoopMessage) -> Action<CoopMessage, CoopToken> {
    Action::Send { from, to, kind: "get", bytes: GET_BYTES, via: Via::Message, copies: Copies::default(), payload }
}

fn body(from: usize, to: usize, bytes: u64, request: RequestId) -> Action<CoopMessage, CoopToken> {
    Action::Send {
        from,
        to,
        kind: "body",
        bytes,
        via: Via::Message,
        copies: Copies::default(),
        payload: CoopMessage::Body { request },
    }
}

impl Policy for Coop {
    type Message = CoopMessage;
    type Token = CoopToken;

    fn name(&self) -> &'static str {
        "coop"
    }

    fn on_request(&mut self, _view: &View<'_>, node: usize, request: Request, out: &mut Actions<Self>) {
        self.requests.insert(request.id, request);
        let cost = self.lookup_cost(request.bytes);
        if cost == 0 {
            self.decide(node, request, out);
        } else {
            out.push(Action::Compute { node, ns: cost, token: CoopToken::Lookup(request.id) });
        }
    }

    fn on_served(&mut self, _view: &View<'_>, served: Served<CoopToken>, out: &mut Actions<Self>) {
        match served.token {
            CoopToken::Origin { request, to } => out.push(body(served.node, to, served.request.bytes, request)),
            // A request answered from disk (never in a valid configuration).
            _ => out.push(Action::Reply { node: served.node, request: served.request.id }),
        }
    }

    fn on_message(&mut self, _view: &View<'_>, d: Delivery<CoopMessage>, out: &mut Actions<Self>) {
        let Some(&request) = (match d.payload {
            CoopMessage::Get { request, .. }
            | CoopMessage::Body { request }
            | CoopMessage::OwnerGet { request }
            | CoopMessage::OwnerMiss { request } => self.requests.get(&request),
            CoopMessage::Background => None,
        }) else {
            return;
        };
        match d.payload {
            CoopMessage::Get { to, .. } => out.push(Action::Serve {
                node: d.to,
                request: request.id,
                caching: crate::Caching::Normal,
                token: CoopToken::Origin { request: request.id, to },
            }),
            CoopMessage::Body { .. } if d.to == request.initial => {
                self.requests.remove(&request.id);
                out.push(Action::Reply { node: d.to, request: request.id });
            }
            CoopMessage::Body { .. } => out.push(body(d.to, request.initial, request.bytes, request.id)),
            CoopMessage::OwnerGet { .. } => out.push(body(d.to, request.initial, request.bytes, request.id)),
            CoopMessage::OwnerMiss { .. } => {
                let backend = self.backend(request.doc);
                let payload = CoopMessage::Get { request: request.id, to: d.to };
                if self.config.miss_cpu_ns == 0 {
                    out.push(get(d.to, backend, payload));
                } else {
                    let token = CoopToken::MissWork { request: request.id, to: backend, payload };
                    out.push(Action::Compute { node: d.to, ns: self.config.miss_cpu_ns, token });
                }
            }
            CoopMessage::Background => {}
        }
    }

    fn on_done(&mut self, _view: &View<'_>, done: Done<CoopToken>, out: &mut Actions<Self>) {
        match done.token {
            CoopToken::Lookup(id) => {
                if let Some(&request) = self.requests.get(&id) {
                    self.decide(done.node, request, out);
                }
            }
            CoopToken::Read(id) => {
                self.requests.remove(&id);
                out.push(Action::Reply { node: done.node, request: id });
            }
            CoopToken::MissWork { to, payload, .. } => out.push(get(done.node, to, payload)),
            CoopToken::Origin { .. } | CoopToken::Background => {}
        }
    }

    fn counters(&self) -> BTreeMap<String, u64> {
        let s = self.model.stats();
        let mut c = BTreeMap::from([
            ("coop_local_hits".to_string(), s.local_hits),
            ("coop_remote_hits".to_string(), s.remote_hits),
            ("coop_misses".to_string(), s.misses),
            ("coop_swaps".to_string(), s.swaps),
            ("coop_lost".to_string(), s.lost),
            ("coop_duplicates_dropped".to_string(), s.duplicates_dropped),
            ("coop_distinct_entities".to_string(), self.model.distinct_entities() as u64),
        ]);
        for (kind, n) in &self.model.tally().messages {
            c.insert(format!("coop_msg_{}", kind.name()), *n);
        }
        c
    }
}
