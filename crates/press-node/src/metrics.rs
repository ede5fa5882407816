//! A node's `/metrics`, `/healthz` and `/readyz` on `--metrics-listen`
//! (`tierstack_tier_http::observe`): the counters of `GET /stats`, by
//! Fig. 1's decision branch and Table 2's message type, and its peers'
//! state as its cluster view holds it.

use crate::node::Shared;
use crate::PressNode;
use std::sync::Arc;
use tierstack_press::proto::MsgType;
use tierstack_stats::exposition::{Exposition, Labels};
use tierstack_tier_http::observe::{Observed, ServingFlag};

struct NodeObserved {
    shared: Arc<Shared>,
    serving: ServingFlag,
}

impl PressNode {
    /// What `--metrics-listen` serves for this node; `serving` is set by
    /// the command once it serves.
    pub fn observed(&self, serving: ServingFlag) -> Arc<dyn Observed> {
        Arc::new(NodeObserved { shared: self.shared.clone(), serving })
    }
}

impl Observed for NodeObserved {
    fn metrics(&self, out: &mut Exposition) {
        let stats = self.shared.snapshot();
        let (transport, mode) = (stats.transport.as_str(), stats.mode.as_str());
        out.gauges(
            "tierstack_press_node_info",
            "This node's communication version (transport) and server mode (always 1).",
            &[(&[("transport", transport), ("mode", mode)], 1.0)],
        );
        let mut counter =
            |name: &str, help: &str, value: u64| out.counter(&format!("tierstack_press_{name}_total"), help, value);
        counter("requests", "Client requests received (this node was their initial node).", stats.requests);
        counter("served_for_peers", "Forwarded requests this node served for its peers.", stats.served_for_peers);
        counter("replies_relayed", "Forwarded requests whose file came back and was relayed.", stats.replies_relayed);
        counter(
            "forward_fallbacks",
            "Forwarded requests served here because the service node failed.",
            stats.forward_fallbacks,
        );
        counter("cache_hits", "Reads whose file was in the memory cache.", stats.cache_hits);
        counter("cache_misses", "Reads whose file was not in the memory cache.", stats.cache_misses);
        counter("disk_reads", "Reads that went to the (emulated) disk.", stats.disk_reads);
        counter(
            "caching_broadcasts",
            "Caching messages broadcast (a file entered or left the cache).",
            stats.caching_broadcasts,
        );
        counter("peers_declared_dead", "Peers this node declared dead.", stats.peers_declared_dead);
        counter("ring_peer_restarts", "Peers found restarted on the rings (a new epoch).", stats.ring_peer_restarts);
        counter("bad_messages", "Malformed intra-cluster messages dropped.", stats.bad_messages);
        counter("send_failures", "Intra-cluster sends that failed.", stats.send_failures);
        counter(
            "zero_copy_fallbacks",
            "Forwarded files copied because they were not in the registered cache.",
            stats.zero_copy_fallbacks,
        );
        counter("sends_inline", "Intra-cluster sends made inline from the request's task.", stats.sends_inline);
        counter(
            "sends_blocking",
            "Intra-cluster sends handed to a blocking thread because they would have waited.",
            stats.sends_blocking,
        );
        counter("revalidated", "Cached copies dropped because their file changed on disk.", stats.revalidated);
        counter("streamed", "Responses streamed from disk (large files the cache does not keep).", stats.streamed);
        counter(
            "slab_full",
            "Cached files the byte slab had no room for (read from disk on each hit).",
            stats.slab_full,
        );
        let link = stats.link;
        counter(
            "zero_copy_sends",
            "Zero: forwarded files written to the peer's ring straight from the registered cache.",
            link.files_from_slab,
        );
        counter(
            "receiver_idle_waits",
            "Waits the receiver (TCP, Base: the receive thread; rings: the poll thread) began with nothing to take.",
            link.idle_waits,
        );
        counter(
            "receiver_wakeups",
            "Receiver waits ended by an arriving message (TCP, Base) or doorbell (rings).",
            link.woken,
        );
        counter(
            "doorbells",
            "Ring versions: doorbells rung at a peer that had published it was going to sleep.",
            link.doorbells,
        );
        let [opened, skipped, probes, closed] = stats.breaker;
        out.counters(
            "tierstack_press_breaker_total",
            "The peers' circuit breakers: opened after a failed or unanswered forward, forwards skipped while open, probes after a cool-down, breakers a probe closed.",
            &[
                (&[("event", "opened")], opened),
                (&[("event", "skipped")], skipped),
                (&[("event", "probe")], probes),
                (&[("event", "closed")], closed),
            ],
        );
        let branches: Vec<([(&str, &str); 1], u64)> =
            crate::transport::BRANCHES.iter().zip(link.branches).map(|(name, n)| ([("branch", *name)], n)).collect();
        out.counters(
            "tierstack_press_fig1_branches_total",
            "Client requests by the line of Fig. 1 that chose the service node (load balancing: initial-takes-over, idle-takes-over, all-overloaded).",
            &samples(&branches),
        );
        out.counters(
            "tierstack_press_decisions_total",
            "Client requests by Fig. 1's decision: served here cached, served here uncached (max_size or more), forwarded.",
            &[
                (&[("decision", "local")], stats.served_local),
                (&[("decision", "uncached")], stats.served_uncached),
                (&[("decision", "forwarded")], stats.forwarded),
            ],
        );
        let types: Vec<(String, usize)> =
            MsgType::ALL.iter().map(|t| (t.name().to_ascii_lowercase(), *t as usize)).collect();
        let by_type = |values: &[u64; 4]| -> Vec<([(&str, &str); 2], u64)> {
            types.iter().map(|(name, at)| ([("transport", transport), ("type", name.as_str())], values[*at])).collect()
        };
        let (messages, bytes) = (by_type(&stats.sent_messages), by_type(&stats.sent_bytes));
        out.counters(
            "tierstack_press_sent_messages_total",
            "Intra-cluster messages sent, by communication version and Table 2 type.",
            &samples(&messages),
        );
        out.counters(
            "tierstack_press_sent_bytes_total",
            "Intra-cluster bytes sent, by communication version and Table 2 type.",
            &samples(&bytes),
        );
        let (alive, dead) = {
            let view = self.shared.view();
            let me = view.me();
            (0..view.nodes()).filter_map(|i| view.member(i)).filter(|m| *m != me).fold((0, 0), |(alive, dead), m| {
                if view.is_alive(m) {
                    (alive + 1, dead)
                } else {
                    (alive, dead + 1)
                }
            })
        };
        let skipped = {
            let breakers = self.shared.breakers();
            let me = self.shared.me().index();
            (0..self.shared.config.nodes).filter(|&i| i != me && !breakers.is_closed(i)).count()
        };
        out.gauge(
            "tierstack_press_peers_breaker_open",
            "Peers whose circuit breaker is open or probing (their requests served here).",
            skipped as f64,
        );
        out.gauges(
            "tierstack_press_peers",
            "Peers by state in this node's cluster view.",
            &[(&[("state", "alive")], f64::from(alive)), (&[("state", "dead")], f64::from(dead))],
        );
        let mut gauge = |name: &str, help: &str, value: f64| out.gauge(&format!("tierstack_press_{name}"), help, value);
        gauge("load", "Open client connections plus forwarded requests in service now.", f64::from(stats.load));
        gauge("cache_bytes", "Bytes in the memory cache now.", stats.cache_bytes as f64);
        gauge("cache_objects", "Files in the memory cache now.", stats.cache_objects as f64);
        gauge("files_in_view", "Files the cluster view knows a server of.", stats.files_in_view as f64);
    }

    fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        vec![("serving", self.serving.check())]
    }
}

/// Rows of fixed-size label sets as the exposition takes them.
fn samples<'a, const N: usize>(rows: &'a [([(&'a str, &'a str); N], u64)]) -> Vec<(Labels<'a>, u64)> {
    rows.iter().map(|(labels, n)| (&labels[..], *n)).collect()
}
