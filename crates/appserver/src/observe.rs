//! `/metrics`, `/healthz` and `/readyz` of `app-module` and `app-server`,
//! served on `--metrics-listen` (`tierstack_tier_http::observe`): the
//! application server's client listener does not serve them, because a
//! proxy forwards client paths to it. The module's counters are the
//! module server's own (`tierstack_coherent::module::ModuleStats`); they
//! are written here, a layer above `coherent`, which knows nothing of HTTP.

use crate::{AppServer, State};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tierstack_coherent::module::ModuleServer;
use tierstack_stats::exposition::Exposition;
use tierstack_tier_http::observe::{Observed, ServingFlag};

/// Nanoseconds as seconds, for the `_seconds_total` counters.
fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// The application module's observation: its grants, queues and update
/// hold times. Ready while it serves its socket.
pub struct ModuleObserved {
    server: Arc<ModuleServer>,
    serving: ServingFlag,
}

impl ModuleObserved {
    pub fn new(server: Arc<ModuleServer>, serving: ServingFlag) -> Self {
        ModuleObserved { server, serving }
    }
}

impl Observed for ModuleObserved {
    fn metrics(&self, out: &mut Exposition) {
        let stats = self.server.stats();
        let mut counter =
            |name: &str, help: &str, value: u64| out.counter(&format!("tierstack_module_{name}"), help, value);
        counter("reads_granted_total", "READ_PROCEEDs sent (reads granted).", stats.reads_granted);
        counter("updates_granted_total", "UPDATE_PROCEEDs sent (updates granted).", stats.updates_granted);
        counter(
            "requests_queued_total",
            "Requests not granted at once: they waited in a queue.",
            stats.requests_queued,
        );
        counter(
            "requests_refused_total",
            "Request lines answered with an error (malformed, unknown key or id, protocol mistake, late DONE).",
            stats.requests_refused,
        );
        counter(
            "grants_revoked_total",
            "Grants held past the grant lifetime and taken back (expired).",
            stats.grants_revoked,
        );
        counter("pages_published_total", "Pages published with UPDATE_DONE.", stats.pages_published);
        counter(
            "pages_unpublished_total",
            "Pages brought with UPDATE_DONE but not published (too large, malformed, no area).",
            stats.pages_unpublished,
        );
        counter(
            "connections_accepted_total",
            "Connections accepted on the module's socket.",
            stats.connections_accepted,
        );
        counter("peers_refused_total", "Connections refused for their peer's credentials.", stats.peers_refused);
        out.gauge("tierstack_module_connections_open", "Connections open now.", stats.connections_open as f64);
        out.gauge(
            "tierstack_module_requests_in_progress",
            "Requests queued or holding access now.",
            stats.requests_in_progress as f64,
        );
        let queues = stats.queues;
        out.gauges(
            "tierstack_module_queue_depth",
            "Entries in the module's queues now, over every key: Table 1's read and update queues, and updates waiting for admission behind another update.",
            &[
                (&[("queue", "read")], queues.read as f64),
                (&[("queue", "update")], queues.update as f64),
                (&[("queue", "admission")], queues.admission as f64),
            ],
        );
        out.histogram(
            "tierstack_module_update_seconds",
            "Time an update held its grant: from UPDATE_PROCEED to UPDATE_DONE.",
            self.server.update_seconds(),
        );
    }

    fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        vec![("serving", self.serving.check())]
    }
}

/// The application server's observation: requests by outcome, its module
/// round trips, pushes, and (with `--publish-load`) the load it publishes.
/// Ready while it serves and the module accepts connections.
struct AppServerObserved {
    state: Arc<State>,
    serving: ServingFlag,
}

impl AppServer {
    /// What `--metrics-listen` serves for this server; `serving` is set by
    /// the command once it serves.
    pub fn observed(&self, serving: ServingFlag) -> Arc<dyn Observed> {
        Arc::new(AppServerObserved { state: self.state.clone(), serving })
    }
}

impl Observed for AppServerObserved {
    fn metrics(&self, out: &mut Exposition) {
        let c = &self.state.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        out.counters(
            "tierstack_appserver_requests_total",
            "Document requests by outcome: read or update served, unknown document, module error, fenced (421).",
            &[
                (&[("outcome", "read")], load(&c.reads)),
                (&[("outcome", "update")], load(&c.updates)),
                (&[("outcome", "not_found")], load(&c.not_found)),
                (&[("outcome", "module_error")], load(&c.module_errors)),
                (&[("outcome", "fenced")], load(&c.fenced)),
            ],
        );
        out.counter(
            "tierstack_appserver_module_reconnects_total",
            "Times the connection to the application module was made again after the module closed it.",
            self.state.module.reconnects(),
        );
        out.counter_f64(
            "tierstack_appserver_generate_seconds_total",
            "Time spent generating or copying response bodies, seconds.",
            seconds(load(&c.generate_ns)),
        );
        out.counter_f64(
            "tierstack_appserver_cpu_cost_seconds_total",
            "CPU time burned as the requests' emulated cost (--cpu-cost), seconds.",
            load(&c.cpu_cost_us) as f64 / 1e6,
        );
        out.counter(
            "tierstack_appserver_pages_published_total",
            "Updates whose page the module published.",
            load(&c.pages_published),
        );
        out.counter(
            "tierstack_appserver_pages_unpublished_total",
            "Updates whose page the module could not publish.",
            load(&c.pages_unpublished),
        );
        out.histogram(
            "tierstack_appserver_read_grant_seconds",
            "Module round trip of a read: from READ_REQUEST to READ_PROCEED.",
            &c.read_grant_seconds,
        );
        out.histogram(
            "tierstack_appserver_update_grant_seconds",
            "Module round trip of an update: from UPDATE_REQUEST to UPDATE_PROCEED.",
            &c.update_grant_seconds,
        );
        if let Some(pusher) = &self.state.pusher {
            push_metrics(&pusher.stats(), out);
        }
        if let Some(publisher) = self.state.load.get() {
            let now = publisher.counters();
            let mut gauge = |name: &str, help: &str, value: u16| {
                out.gauge(&format!("tierstack_appserver_{name}"), help, f64::from(value))
            };
            gauge(
                "running_threads",
                "Published load: threads running a request or computing now.",
                now.running_threads,
            );
            gauge("open_connections", "Published load: client connections open now.", now.open_connections);
            gauge("in_flight_requests", "Published load: document requests in flight now.", now.in_flight_requests);
            gauge("queue_length", "Published load: requests waiting for a grant or a worker now.", now.queue_len);
            out.counter(
                "tierstack_appserver_load_saturated_total",
                "Published-load increments refused because a counter was full.",
                publisher.saturated(),
            );
        }
    }

    fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        // A local socket's connect answers at once (or fails at once).
        let socket = &self.state.module_socket;
        let module =
            std::os::unix::net::UnixStream::connect(socket).map(drop).map_err(|e| format!("{}: {e}", socket.display()));
        vec![("serving", self.serving.check()), ("module", module)]
    }
}

fn push_metrics(push: &crate::PushStats, out: &mut Exposition) {
    let mut counter =
        |name: &str, help: &str, value: u64| out.counter(&format!("tierstack_appserver_push_{name}"), help, value);
    counter("updates_total", "Updates the push path considered.", push.updates);
    counter("state_reads_total", "Proxy cache-state reads.", push.state_reads);
    counter(
        "state_read_errors_total",
        "Proxy cache-state reads that failed (that proxy skipped).",
        push.state_read_errors,
    );
    counter("sent_total", "Pushes sent.", push.pushes_sent);
    counter("sent_bytes_total", "Body bytes of the pushes sent.", push.push_bytes);
    counter("skipped_busy_total", "Updates whose push was skipped: too many in flight.", push.skipped_busy);
    out.counters(
        "tierstack_appserver_push_decisions_total",
        "Push decisions, per update and proxy.",
        &[
            (&[("decision", "push")], push.decided_push),
            (&[("decision", "never")], push.decided_never),
            (&[("decision", "not_cached")], push.decided_not_cached),
            (&[("decision", "not_recent")], push.decided_not_recent),
            (&[("decision", "unlikely")], push.decided_unlikely),
        ],
    );
    out.counters(
        "tierstack_appserver_push_outcomes_total",
        "Pushes by outcome: installed (2xx), declined by the proxy, failed.",
        &[
            (&[("outcome", "installed")], push.pushes_ok),
            (&[("outcome", "declined")], push.pushes_declined),
            (&[("outcome", "failed")], push.pushes_failed),
        ],
    );
    if push.write_through {
        out.counter(
            "tierstack_appserver_write_through_updates_total",
            "Updates that waited for their push before UPDATE_DONE.",
            push.write_through_updates,
        );
        out.counter_f64(
            "tierstack_appserver_write_through_wait_seconds_total",
            "Time updates waited for their write-through push, seconds.",
            seconds(push.write_through_wait_ns),
        );
        out.counter(
            "tierstack_appserver_write_through_timeouts_total",
            "Write-through waits cut short by their bound.",
            push.write_through_timeouts,
        );
    }
}
