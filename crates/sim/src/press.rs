//! PRESS in the simulator: Fig. 1 (`tierstack_press::decide`, the code the
//! real `press-node` runs) over one `ClusterView` per node, changed only by
//! what the nodes tell each other: the load piggy-backed on every message,
//! caching broadcasts when a node starts or stops caching a file, and Fig.
//! 1's own additions.
//!
//! A request forwarded to a service node is served there (cached on a miss,
//! one hop) and its file sent back; the initial node replies without caching
//! it. The communication versions differ in how messages travel and which
//! copies the file transfer makes (seed-notes c.3): Base sends messages
//! with a copy at both ends; RDMA-1c remote-writes with both copies; RDMA
//! skips the receiver's copy; Zero skips both.

use crate::policy::{Action, Actions, Caching, Copies, Delivery, DocId, Policy, Request, RequestId, Served, Via, View};
use std::collections::BTreeMap;
use tierstack_press::{decide, CachingEvent, ClusterView, Decision, Member, PolicyConfig};

/// Bytes of a forward or caching message (header, request id, a short path).
const CONTROL_BYTES: u64 = 40;
/// Bytes of a file message's header.
const FILE_HEADER_BYTES: u64 = 20;

/// PRESS's communication versions, as the simulator charges them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PressVersion {
    Base,
    Rdma1c,
    Rdma,
    Zero,
}

impl PressVersion {
    fn via(self) -> Via {
        match self {
            PressVersion::Base => Via::Message,
            _ => Via::RemoteWrite,
        }
    }

    fn file_copies(self) -> Copies {
        match self {
            PressVersion::Base | PressVersion::Rdma1c => Copies { sender: 1, receiver: 1 },
            PressVersion::Rdma => Copies { sender: 1, receiver: 0 },
            PressVersion::Zero => Copies { sender: 0, receiver: 0 },
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PressVersion::Base => "press-base",
            PressVersion::Rdma1c => "press-rdma-1c",
            PressVersion::Rdma => "press-rdma",
            PressVersion::Zero => "press-zero",
        }
    }
}

/// What PRESS nodes send each other.
#[derive(Clone, Debug, PartialEq)]
pub enum PressMessage {
    Forward(Request),
    File(RequestId),
    Caching { doc: DocId, start: bool },
}

/// Where a serve's bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PressToken {
    /// To this node's own client.
    Client,
    /// Back to the initial node that forwarded it.
    Peer { initial: usize },
}

/// The PRESS policy: one view per node.
pub struct Press {
    version: PressVersion,
    config: PolicyConfig,
    views: Vec<ClusterView<DocId>>,
    forwards: u64,
    caching_broadcasts: u64,
}

impl Press {
    /// PRESS on `nodes` nodes (1 to `tierstack_press::view::MEMBERS_MAX`).
    pub fn new(nodes: usize, version: PressVersion, config: PolicyConfig) -> Result<Press, tierstack_press::ViewError> {
        let views = (0..nodes)
            .map(|i| ClusterView::new(nodes, Member(u16::try_from(i).unwrap_or(u16::MAX))))
            .collect::<Result<_, _>>()?;
        Ok(Press { version, config, views, forwards: 0, caching_broadcasts: 0 })
    }

    fn broadcast(&mut self, from: usize, doc: DocId, start: bool, out: &mut Actions<Self>) {
        let event = if start { CachingEvent::Start } else { CachingEvent::Stop };
        self.views[from].on_caching(Member(from as u16), &doc, event);
        for to in (0..self.views.len()).filter(|&to| to != from) {
            self.caching_broadcasts += 1;
            out.push(Action::Send {
                from,
                to,
                kind: "caching",
                bytes: CONTROL_BYTES,
                via: self.version.via(),
                copies: Copies::default(),
                payload: PressMessage::Caching { doc, start },
            });
        }
    }
}

impl Policy for Press {
    type Message = PressMessage;
    type Token = PressToken;

    fn name(&self) -> &'static str {
        self.version.name()
    }

    fn on_request(&mut self, view: &View<'_>, node: usize, request: Request, out: &mut Actions<Self>) {
        let mine = &mut self.views[node];
        mine.set_load(Member(node as u16), view.load(node));
        let outcome = decide(&self.config, mine, &request.doc, request.bytes);
        match outcome.decision {
            Decision::ServeUncached => out.push(Action::Serve {
                node,
                request: request.id,
                caching: Caching::Bypass,
                token: PressToken::Client,
            }),
            Decision::ServeLocal => out.push(Action::Serve {
                node,
                request: request.id,
                caching: Caching::Normal,
                token: PressToken::Client,
            }),
            Decision::Forward(service) => {
                self.forwards += 1;
                out.push(Action::Send {
                    from: node,
                    to: service.index(),
                    kind: "forward",
                    bytes: CONTROL_BYTES,
                    via: self.version.via(),
                    copies: Copies::default(),
                    payload: PressMessage::Forward(request),
                });
            }
        }
    }

    fn on_served(&mut self, _view: &View<'_>, served: Served<PressToken>, out: &mut Actions<Self>) {
        if let Some(inserted) = &served.inserted {
            for (doc, _) in &inserted.evicted {
                self.broadcast(served.node, *doc, false, out);
            }
            if inserted.stored {
                self.broadcast(served.node, served.request.doc, true, out);
            }
        }
        match served.token {
            PressToken::Client => out.push(Action::Reply { node: served.node, request: served.request.id }),
            PressToken::Peer { initial } => out.push(Action::Send {
                from: served.node,
                to: initial,
                kind: "file",
                bytes: FILE_HEADER_BYTES + served.request.bytes,
                via: self.version.via(),
                copies: self.version.file_copies(),
                payload: PressMessage::File(served.request.id),
            }),
        }
    }

    fn on_message(&mut self, _view: &View<'_>, delivery: Delivery<PressMessage>, out: &mut Actions<Self>) {
        let (from, to) = (delivery.from, delivery.to);
        self.views[to].set_load(Member(from as u16), delivery.sender_load);
        match delivery.payload {
            // One hop: the service node serves what reaches it.
            PressMessage::Forward(request) => out.push(Action::Serve {
                node: to,
                request: request.id,
                caching: Caching::Normal,
                token: PressToken::Peer { initial: from },
            }),
            // The initial node relays the file and does not cache it.
            PressMessage::File(request) => out.push(Action::Reply { node: to, request }),
            PressMessage::Caching { doc, start } => {
                let event = if start { CachingEvent::Start } else { CachingEvent::Stop };
                self.views[to].on_caching(Member(from as u16), &doc, event);
            }
        }
    }

    fn counters(&self) -> BTreeMap<String, u64> {
        BTreeMap::from([
            ("press_forwards".to_string(), self.forwards),
            ("press_caching_broadcasts".to_string(), self.caching_broadcasts),
        ])
    }
}
